package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/region/strong"
	"github.com/nats-io/nats.go"
)

// Strong limits' requests (region/strong) travel on core NATS, outside every
// stream, as request/reply: a PoP asks a key's home PoP on
// edgelimit._strong.<region>.<pop>, the home's own subject, and the reply
// comes back on the asker's inbox. Each PoP subscribes to its own subject
// only: one PoP decides for each key (store.Strong says why), so there is
// no queue group to spread requests over. The home answers only on an
// inbox (_INBOX.…): PoPs' NATS credentials let it reply to what it is asked
// (Permissions). A request that finds no
// subscriber fails at once (no responders), one whose home is cut off times
// out; both leave the decision to the limit's partition policy.
const strongToken = "_strong"

// StrongSubject returns the subject on which pop of region answers strong
// requests.
func StrongSubject(region, pop string) string {
	return subjectRoot + "." + strongToken + "." + region + "." + pop
}

// StrongAnswer decides a strong request as its key's home, at now (this
// PoP's clock, unix ns): store.Strong.AnswerAt.
type StrongAnswer func(ctx context.Context, now int64, req strong.Request) (strong.Reply, error)

// ServeStrong answers the strong requests addressed to pop of region on nc
// with answer, until the returned subscription is unsubscribed. A request
// that does not decode, or that answer refuses, gets no reply: its asker
// times out and follows its policy. now is the PoP's clock (the engine's,
// with the agreed correction). refused, when set, is called for each.
func ServeStrong(nc *nats.Conn, region, pop string, now func() int64, answer StrongAnswer, refused func(error)) (*nats.Subscription, error) {
	if err := validToken("region", region); err != nil {
		return nil, err
	}
	if err := validToken("pop", pop); err != nil {
		return nil, err
	}
	return nc.Subscribe(StrongSubject(region, pop), func(m *nats.Msg) {
		fail := func(err error) {
			if refused != nil {
				refused(err)
			}
		}
		if m.Reply == "" {
			fail(errors.New("strong request without a reply subject"))
			return
		}
		if !strings.HasPrefix(m.Reply, nats.InboxPrefix) {
			// The home may reply to any request it gets (allow_responses,
			// see Permissions): a reply subject that is not an inbox would
			// have it publish where the asker itself may not.
			fail(fmt.Errorf("strong request with a reply subject that is not an inbox: %q", m.Reply))
			return
		}
		req, err := strong.DecodeRequest(m.Data)
		if err != nil {
			fail(err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), strongAnswerTimeout)
		defer cancel()
		rep, err := answer(ctx, now(), req)
		if err != nil {
			fail(err)
			return
		}
		if err := m.Respond(strong.AppendReply(nil, &rep)); err != nil {
			fail(fmt.Errorf("strong reply: %w", err))
		}
	})
}

// strongAnswerTimeout bounds a home's own decision (its store's answer).
const strongAnswerTimeout = 5 * time.Second

// StrongAsker asks homes over a NATS connection (store.Asker). Its zero
// value is not usable; use NewStrongAsker.
type StrongAsker struct {
	nc       *nats.Conn
	regionOf map[string]string // PoP → region
}

// NewStrongAsker returns an asker over nc for the PoPs of t.
func NewStrongAsker(nc *nats.Conn, t Topology) *StrongAsker {
	a := &StrongAsker{nc: nc, regionOf: map[string]string{}}
	for r, pops := range t.Regions {
		for _, p := range pops {
			a.regionOf[p] = r
		}
	}
	return a
}

// Ask sends req to home and waits at most timeout (ns) for a reply, which
// it decodes and checks against req (strong.CheckReply). The round trip is
// measured on the wall clock.
func (a *StrongAsker) Ask(ctx context.Context, _ int64, home string, req strong.Request, timeout int64) (strong.Reply, int64, error) {
	region, ok := a.regionOf[home]
	if !ok {
		return strong.Reply{}, 0, fmt.Errorf("strong: home %q is not in the topology", home)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(timeout))
	defer cancel()
	start := time.Now()
	m, err := a.nc.RequestWithContext(ctx, StrongSubject(region, home), strong.AppendRequest(nil, &req))
	rtt := time.Since(start)
	if err != nil {
		return strong.Reply{}, 0, fmt.Errorf("strong: ask %s: %w", home, err)
	}
	rep, err := strong.DecodeReply(m.Data)
	if err != nil {
		return strong.Reply{}, 0, err
	}
	if err := strong.CheckReply(&req, &rep); err != nil {
		return strong.Reply{}, 0, err
	}
	return rep, int64(rtt), nil
}

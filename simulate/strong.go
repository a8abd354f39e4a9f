package simulate

import (
	"context"
	"errors"
	"time"

	"github.com/edgelimit/edgelimit/region/strong"
)

// errNoReply is a simulated home's silence: its link is cut, or the round
// trip took longer than the asker waits.
var errNoReply = errors.New("simulate: no reply from the home within the timeout")

// simAsker carries a strong limit's requests from PoP from to the key's
// home PoP over the simulated network, as store.Strong asks them on NATS
// in a PoP: each way takes the latency between the two regions (with its
// jitter, and a retransmission when the link loses the message); a cut link
// answers nothing. The home decides at the instant the request reaches it,
// on its own clock, with the very store.Strong code a PoP runs. The check
// waits the round trip, or the timeout when no reply comes in time, and
// run.waited records it.
type simAsker struct {
	r    *run
	from int
}

func (a *simAsker) Ask(ctx context.Context, _ int64, home string, req strong.Request, timeout int64) (strong.Reply, int64, error) {
	r := a.r
	h, ok := r.popIndex[home]
	if !ok {
		return strong.Reply{}, 0, errNoReply
	}
	ra, rb := r.top.region[a.from], r.top.region[h]
	now := r.q.now
	if r.top.healAt(ra, rb, now) > now || r.top.healAt(rb, ra, now) > now {
		r.waited += timeout
		return strong.Reply{}, 0, errNoReply
	}
	way := func(x, y int) int64 {
		d := r.latency(x, y)
		if loss := r.top.loss[x][y]; loss > 0 && r.q.rand.Float64() < loss {
			d += retransmit
		}
		return d
	}
	rtt := way(ra, rb) + way(rb, ra)
	if rtt > timeout {
		r.waited += timeout
		return strong.Reply{}, 0, errNoReply
	}
	// As the centralized row's store, the home decides at the instant the
	// request arrived at its PoP, on its own clock: each decision is graded
	// at that instant, so the exact log and the home order them alike.
	rep, err := r.strongs[h].AnswerAt(ctx, Epoch.UnixNano()+now+r.skew[h], req)
	if err != nil {
		return strong.Reply{}, 0, err
	}
	r.waited += rtt
	return rep, rtt, nil
}

// regionMap is the scenario's regions as region name → PoP names.
func (sc *Scenario) regionMap() map[string][]string {
	m := make(map[string][]string, len(sc.Regions))
	for _, rg := range sc.Regions {
		m[rg.Name] = rg.PoPs
	}
	return m
}

// latencyBucket is the resolution of the added-latency histogram, and
// latencyBuckets its length: latencies of 10 s or more share the last.
const (
	latencyBucket  = int64(100 * time.Microsecond)
	latencyBuckets = 100_000
)

// addLatency records that a decision waited d on the network.
func (r *run) addLatency(d int64) {
	r.latencyNs += d
	if r.latencyHist == nil {
		if d == 0 && r.strategy != Centralized && r.strongs == nil {
			return // a strategy that never waits: the histogram stays empty
		}
		r.latencyHist = make([]int64, latencyBuckets)
		r.latencyHist[0] = r.oracle.decisions // the decisions before this one waited nothing
	}
	r.latencyHist[min(d/latencyBucket, latencyBuckets-1)]++
}

// latencyQuantile is the q-quantile of the added latency, rounded up to
// latencyBucket.
func (r *run) latencyQuantile(q float64) time.Duration {
	var n int64
	for _, c := range r.latencyHist {
		n += c
	}
	if n == 0 {
		return 0
	}
	rank := int64(q * float64(n-1))
	for b, c := range r.latencyHist {
		if rank < c {
			if b == 0 {
				return 0
			}
			return time.Duration(int64(b+1) * latencyBucket)
		}
		rank -= c
	}
	return 0
}

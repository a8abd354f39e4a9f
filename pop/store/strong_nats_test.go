package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/region"
	"github.com/edgelimit/edgelimit/region/strong"
	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
	"github.com/nats-io/nats.go"
)

// strongOverNATS starts one embedded NATS server per region of top, linked
// as a deployment links them (natstest: every region after the first has a
// leaf link to the first, through a proxy that can cut it), and one Strong
// store per PoP that asks its homes and answers as a home over its
// region's server, as a PoP does over its NATS connection.
func strongOverNATS(t *testing.T, top region.Topology) (*natstest.Cluster, map[string]*Strong) {
	t.Helper()
	c := natstest.StartRegions(t, top.Names()...)
	pops := map[string]*Strong{}
	var all []string
	for _, r := range top.Names() {
		all = append(all, top.Regions[r]...)
	}
	for _, r := range top.Names() {
		for _, p := range top.Regions[r] {
			nc, err := nats.Connect(c.URL(r), nats.Name(p))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			m := NewMemory(MemoryConfig{Replica: p, RegionPeers: top.Regions[r], Replicas: all})
			s, err := NewStrong(m, StrongConfig{Self: p, Region: r, Regions: top.Regions, Asker: replication.NewStrongAsker(nc, top)})
			if err != nil {
				t.Fatal(err)
			}
			now := func() int64 { return time.Now().UnixNano() }
			sub, err := replication.ServeStrong(nc, r, p, now, s.AnswerAt, func(err error) { t.Errorf("%s refused a request: %v", p, err) })
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			pops[p] = s
		}
	}
	// Interest in a home's subject reaches the other regions over the leaf
	// links a moment after it subscribes: wait, within patience, until
	// every PoP's request reaches every other PoP as a home.
	deadline := time.Now().Add(2 * time.Minute)
	for from, fs := range pops {
		for home := range pops {
			if home == from {
				continue
			}
			it := homedAt(t, fs, home, "probe", 1)
			req := strong.Request{ID: 1, Key: string(it.Key), Spec: strong.Spec{Algorithm: uint8(it.Spec.Algorithm), Limit: 1, Window: it.Spec.Window}}
			for {
				if _, _, err := (*fs.asker.Load()).Ask(context.Background(), 0, home, req, int64(time.Second)); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s cannot reach %s's strong subject after 2 minutes", from, home)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	return c, pops
}

// homedAt returns a global strong item of limit n, named from prefix, whose
// key's home is the PoP home.
func homedAt(t *testing.T, s *Strong, home, prefix string, n int64) limit.Item {
	t.Helper()
	for i := range 10_000 {
		it := strongItem(fmt.Sprintf("%s-%d", prefix, i), n, limit.ScopeGlobal, limit.SlidingWindow)
		if h, err := s.HomeOf(string(it.Key), limit.ScopeGlobal); err == nil && h.PoP == home {
			return it
		}
	}
	t.Fatalf("no key of 10000 is homed at %s", home)
	return limit.Item{}
}

// On real NATS, between two regions: checks at both PoPs of a strong limit
// admit exactly the limit, whichever region is the home; with the home's
// region cut off, the other follows the stated policy — a fail_closed limit
// denies everything, an open one admits its region's share on its own.
func TestStrongOverNATS(t *testing.T) {
	top := region.Topology{Regions: map[string][]string{"eu": {"eu-a"}, "us": {"us-a"}}}
	c, pops := strongOverNATS(t, top)
	for _, home := range []string{"eu-a", "us-a"} {
		it := homedAt(t, pops["eu-a"], home, "exact", 20)
		admitted := 0
		for range 30 {
			for _, p := range []string{"eu-a", "us-a"} {
				admitted += admit(t, pops[p], time.Now().UnixNano(), it, 1)
			}
		}
		if admitted != 20 {
			t.Errorf("home %s: 60 checks over two regions admitted %d, want exactly the limit 20", home, admitted)
		}
	}
	if st := pops["us-a"].Stats(); st.Unreachable != 0 {
		t.Errorf("us-a: %d checks found no home on an intact network", st.Unreachable)
	}

	// Cut the only link between the regions (us's leaf link to eu), and
	// check at us-a the keys homed at eu-a.
	c.Link("us").Cut()
	closed := homedAt(t, pops["us-a"], "eu-a", "closed", 20)
	closed.FailClosed = true
	open := homedAt(t, pops["us-a"], "eu-a", "open", 20)
	us := pops["us-a"]
	if got := admit(t, us, time.Now().UnixNano(), closed, 30); got != 0 {
		t.Errorf("fail_closed, home cut off: admitted %d of 30, want 0", got)
	}
	if got := admit(t, us, time.Now().UnixNano(), open, 30); got != 10 {
		t.Errorf("open, home cut off: admitted %d of 30, want 10, the share of one region of two", got)
	}
	st := us.Stats()
	if st.Unreachable != 60 || st.FailClosedDenials != 30 {
		t.Errorf("us-a's stats %+v: want 60 checks without a home, 30 of them denied as fail_closed", st)
	}
	// The home, on its side of the cut, still decides its own checks.
	if got := admit(t, pops["eu-a"], time.Now().UnixNano(), open, 30); got != 20 {
		t.Errorf("the home admitted %d of 30 of its own checks during the cut, want its limit 20", got)
	}
}

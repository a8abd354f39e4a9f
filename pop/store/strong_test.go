package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/region/strong"
)

// memNet carries strong requests between Strong stores in one process: the
// home's AnswerAt is called directly, unless the home is cut off (cut) or a
// corrupt function rewrites its reply.
type memNet struct {
	mu      sync.Mutex
	stores  map[string]*Strong
	cut     map[string]bool
	corrupt func(*strong.Reply)
}

func (n *memNet) asker() *netAsker { return &netAsker{n} }

type netAsker struct{ n *memNet }

func (a *netAsker) Ask(ctx context.Context, now int64, home string, req strong.Request, timeout int64) (strong.Reply, int64, error) {
	a.n.mu.Lock()
	s, cut, corrupt := a.n.stores[home], a.n.cut[home], a.n.corrupt
	a.n.mu.Unlock()
	if s == nil || cut {
		return strong.Reply{}, 0, errors.New("no reply")
	}
	rep, err := s.AnswerAt(ctx, now, req)
	if err != nil {
		return rep, 0, err
	}
	if corrupt != nil {
		corrupt(&rep)
	}
	return rep, 1e6, nil
}

var strongRegions = map[string][]string{"eu": {"eu-a", "eu-b"}, "us": {"us-a", "us-b"}}

// strongNet returns a Strong store over a replicating Memory per PoP of
// strongRegions, all on one memNet.
func strongNet(t *testing.T) (*memNet, map[string]*Strong) {
	t.Helper()
	n := &memNet{stores: map[string]*Strong{}, cut: map[string]bool{}}
	var all []string
	for _, pops := range strongRegions {
		all = append(all, pops...)
	}
	slices.Sort(all)
	for reg, pops := range strongRegions {
		for _, p := range pops {
			m := NewMemory(MemoryConfig{Replica: p, RegionPeers: pops, Replicas: all})
			s, err := NewStrong(m, StrongConfig{Self: p, Region: reg, Regions: strongRegions, Asker: n.asker()})
			if err != nil {
				t.Fatal(err)
			}
			n.stores[p] = s
		}
	}
	return n, n.stores
}

func strongItem(value string, n int64, scope limit.Scope, alg limit.Algorithm) limit.Item {
	it := windowItem(rules.Minute, alg, scope, n, value)
	it.Consistency = limit.Strong
	return it
}

// Checks at every PoP of a strong limit admit exactly the limit: the home
// decides them all on one counter.
func TestStrongAdmitsExactlyTheLimit(t *testing.T) {
	for _, scope := range []limit.Scope{limit.ScopeGlobal, limit.ScopeRegion} {
		for _, alg := range []limit.Algorithm{limit.SlidingWindow, limit.FixedWindow, limit.TokenBucket, limit.GCRA, limit.SlidingLog} {
			t.Run(fmt.Sprintf("%v/%v", scope, alg), func(t *testing.T) {
				_, stores := strongNet(t)
				it := strongItem("k", 50, scope, alg)
				now := int64(1e12)
				admitted := map[string]int{}
				for round := range 40 {
					for name, s := range stores {
						admitted[name] += admit(t, s, now+int64(round), it, 1)
					}
				}
				// A global limit holds over all PoPs; a region limit over
				// each region's.
				total := map[string]int{}
				for name, n := range admitted {
					if scope == limit.ScopeRegion {
						total[stores[name].cfg.Region] += n
					} else {
						total["all"] += n
					}
				}
				for over, n := range total {
					if n != 50 {
						t.Errorf("%s: 40 checks at each PoP admitted %d, want exactly the limit 50 (%v)", over, n, admitted)
					}
				}
				var asked, answered uint64
				for _, s := range stores {
					asked += s.Stats().Asked
					answered += s.Stats().Answered
				}
				if asked == 0 || asked != answered {
					t.Errorf("asked %d, answered %d: want every non-home check asked and answered", asked, answered)
				}
			})
		}
	}
}

// A region limit's home is a PoP of the checking PoP's own region.
func TestStrongRegionHomeIsInRegion(t *testing.T) {
	_, stores := strongNet(t)
	for i := range 50 {
		key := windowItem(rules.Minute, limit.SlidingWindow, limit.ScopeRegion, 1, fmt.Sprint(i)).Key
		for name, s := range stores {
			h, err := s.HomeOf(string(key), limit.ScopeRegion)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(strongRegions[s.cfg.Region], h.PoP) {
				t.Fatalf("%s: region key %d homed at %s, outside its region", name, i, h.PoP)
			}
		}
	}
}

// When the home does not answer, a fail_closed limit denies and any other
// is decided on local knowledge; both are counted.
func TestStrongHomeUnreachable(t *testing.T) {
	n, stores := strongNet(t)
	it := strongItem("k", 10, limit.ScopeGlobal, limit.SlidingWindow)
	h, _ := stores["eu-a"].HomeOf(string(it.Key), it.Scope)
	var asker *Strong // a PoP of the other region
	for name, s := range stores {
		if s.cfg.Region != h.Region {
			asker = stores[name]
			break
		}
	}
	n.cut[h.PoP] = true
	now := int64(1e12)

	closed := it
	closed.FailClosed = true
	if got := admit(t, asker, now, closed, 5); got != 0 {
		t.Errorf("fail_closed, home cut: admitted %d of 5, want 0", got)
	}
	if st := asker.Stats(); st.Unreachable != 5 || st.FailClosedDenials != 5 {
		t.Errorf("fail_closed: stats %+v, want 5 unreachable, 5 fail-closed denials", st)
	}
	// Open: the PoP decides alone, on its own and replicated counts, as an
	// eventual limit held to its region's share (half, of two regions).
	if got := admit(t, asker, now, it, 15); got != 5 {
		t.Errorf("open, home cut: admitted %d of 15, want the limit's share 5 on local knowledge", got)
	}
	if st := asker.Stats(); st.Unreachable != 20 || st.Asked != 1 {
		t.Errorf("stats %+v, want 20 unreachable, of which 1 asked: a lost home is left alone for a while", st)
	}
	// The home answers again, and once the pause after its losses is over
	// (DefaultStrongMaxBackoff at most) it is asked: its own counter
	// decides, untouched by the local decisions.
	n.cut[h.PoP] = false
	if got := admit(t, asker, now+int64(DefaultStrongMaxBackoff), it, 15); got != 10 {
		t.Errorf("home back: admitted %d of 15, want 10 from the home's counter", got)
	}
}

// A reply that does not answer the request is never applied: the check
// follows the partition policy instead.
func TestStrongRefusesWrongReplies(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(*strong.Reply)
	}{
		{"other key", func(r *strong.Reply) { r.Key += "x" }},
		{"other id", func(r *strong.Reply) { r.ID++ }},
		{"room past the limit", func(r *strong.Reply) { r.Remaining = 1 << 30 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, stores := strongNet(t)
			n.corrupt = tc.corrupt
			it := strongItem("k", 10, limit.ScopeGlobal, limit.SlidingWindow)
			it.FailClosed = true
			h, _ := stores["eu-a"].HomeOf(string(it.Key), it.Scope)
			for name, s := range stores {
				if name == h.PoP {
					continue
				}
				if got := admit(t, s, int64(1e12), it, 3); got != 0 {
					t.Errorf("%s admitted %d on corrupt replies, want 0 (fail_closed)", name, got)
				}
				if st := s.Stats(); st.Unreachable != 3 {
					t.Errorf("%s: %d unreachable, want 3", name, st.Unreachable)
				}
			}
		})
	}
}

// A home refuses what it should not decide: malformed requests, keys of
// another home, keys no region or global rule builds, a window its key
// does not count.
func TestStrongAnswerRefuses(t *testing.T) {
	_, stores := strongNet(t)
	it := strongItem("k", 10, limit.ScopeGlobal, limit.SlidingWindow)
	h, _ := stores["eu-a"].HomeOf(string(it.Key), it.Scope)
	home := stores[h.PoP]
	var other *Strong
	for name, s := range stores {
		if name != h.PoP {
			other = s
		}
	}
	good := strong.Request{ID: 1, Key: string(it.Key), Hits: 1,
		Spec: strong.Spec{Algorithm: uint8(it.Spec.Algorithm), Limit: 10, Window: it.Spec.Window}}
	if _, err := home.AnswerAt(context.Background(), 1e12, good); err != nil {
		t.Fatalf("the home refused a good request: %v", err)
	}
	popKey := windowItem(rules.Minute, limit.SlidingWindow, limit.ScopePOP, 10, "k").Key
	for _, tc := range []struct {
		name string
		to   *Strong
		edit func(*strong.Request)
	}{
		{"not the home", other, func(*strong.Request) {}},
		{"window not the key's", home, func(r *strong.Request) { r.Spec.Window /= 2 }},
		{"pop-scope key", home, func(r *strong.Request) { r.Key = string(popKey) }},
		{"no rule's key", home, func(r *strong.Request) { r.Key = "free text" }},
		{"negative hits", home, func(r *strong.Request) { r.Hits = -1 }},
		{"bad algorithm", home, func(r *strong.Request) { r.Spec.Algorithm = 7 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tc.edit(&r)
			if _, err := tc.to.AnswerAt(context.Background(), 1e12, r); err == nil {
				t.Errorf("AnswerAt(%+v) decided, want a refusal", r)
			}
		})
	}
}

// A request that other items deny asks the home for nothing: the strong
// limit spends no hits on it.
func TestStrongDeniedRequestSpendsNothingAtHome(t *testing.T) {
	_, stores := strongNet(t)
	it := strongItem("k", 10, limit.ScopeGlobal, limit.SlidingWindow)
	h, _ := stores["eu-a"].HomeOf(string(it.Key), it.Scope)
	var s *Strong
	for name, st := range stores {
		if name != h.PoP {
			s = st
		}
	}
	tight := windowItem(rules.Minute, limit.SlidingWindow, limit.ScopePOP, 2, "other")
	items := []limit.Item{it, tight}
	out := make([]limit.Decision, 2)
	admitted := 0
	for range 8 {
		if err := s.CheckAt(context.Background(), 1e12, 1, items, out); err != nil {
			t.Fatal(err)
		}
		if limit.Admit(items, out) {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("admitted %d, want 2 (the pop limit)", admitted)
	}
	// The strong limit spent only the 2 admitted hits: 8 more remain.
	if got := admit(t, s, 1e12, it, 20); got != 8 {
		t.Errorf("after 6 denied requests the strong limit admits %d, want 8", got)
	}
}

// What the home admitted reaches a PoP cut off from it: every PoP counts the
// strong admissions it served in its replicated counts, so after a cut the
// PoP decides on the window as it was, not on an empty one.
func TestStrongFallbackKnowsTheWindow(t *testing.T) {
	n, stores := strongNet(t)
	it := strongItem("k", 10, limit.ScopeGlobal, limit.SlidingWindow)
	h, _ := stores["eu-a"].HomeOf(string(it.Key), it.Scope)
	var asker, peer *Strong // two PoPs of the other region
	for name, s := range stores {
		if s.cfg.Region != h.Region {
			if asker == nil {
				asker = stores[name]
			} else {
				peer = stores[name]
			}
		}
	}
	now := int64(1e12)
	if got := admit(t, asker, now, it, 4); got != 4 {
		t.Fatalf("home reachable: admitted %d of 4", got)
	}
	// The asker's counts reach its region peer, as replication carries them.
	peer.inner.(*Memory).ApplyAt(now, now, asker.inner.(*Memory).DeltaAt(now))
	n.cut[h.PoP] = true
	// The peer holds half the limit (5) and knows 4 of it spent.
	if got := admit(t, peer, now, it, 10); got != 1 {
		t.Errorf("home cut: the peer admitted %d, want 1 (share 5, 4 admitted before the cut)", got)
	}
}

// homeAndOther returns the home of it and a PoP of another region.
func homeAndOther(t *testing.T, stores map[string]*Strong, it limit.Item) (home, other *Strong) {
	t.Helper()
	h, err := stores["eu-a"].HomeOf(string(it.Key), it.Scope)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range stores {
		if s.cfg.Region != h.Region {
			other = stores[name]
			break
		}
	}
	return stores[h.PoP], other
}

// A PoP that holds a global limit to its partition share (the engine's
// Shrunk item) still has the home decide its checks with the limit the home
// holds, as configured: the home's one counter holds every PoP to the same
// limit, and the asker's share is only what it may admit when the home does
// not answer.
func TestStrongHomeDecidesWithTheConfiguredLimit(t *testing.T) {
	n, stores := strongNet(t)
	it := strongItem("k", 10, limit.ScopeGlobal, limit.SlidingWindow)
	home, other := homeAndOther(t, stores, it)
	shrunk := it
	shrunk.Spec.Limit, shrunk.Shrunk, shrunk.Unshrunk = 5, true, 10
	now := int64(1e12)
	if got := admit(t, home, now, it, 6); got != 6 {
		t.Fatalf("the home admitted %d of 6 of a limit of 10", got)
	}
	// 6 of 10 spent: a PoP at its share of 5 is still admitted up to 10.
	if got := admit(t, other, now, shrunk, 6); got != 4 {
		t.Errorf("a PoP holding half the limit, home reachable: admitted %d of 6 after 6 spent, want 4 (the home decides at 10)", got)
	}
	// So is the home's own check of a Shrunk item: one counter, one limit.
	if got := admit(t, home, now+1, shrunk, 1); got != 0 {
		t.Errorf("the home admitted %d past the limit of 10", got)
	}
	// Without the home the share decides: on the 4 this PoP served, within
	// its 5, one more.
	n.cut[home.cfg.Self] = true
	if got := admit(t, other, now, shrunk, 5); got != 1 {
		t.Errorf("home cut: admitted %d of 5, want 1 (share 5, 4 served here)", got)
	}
}

// A home whose own replication core finds regions cut off decides every
// check of a global limit at the share its engine holds, whatever the asker
// holds: the regions cut off decide theirs without it.
func TestStrongHomeDecidesAtItsOwnShare(t *testing.T) {
	_, stores := strongNet(t)
	it := strongItem("k", 10, limit.ScopeGlobal, limit.SlidingWindow)
	home, other := homeAndOther(t, stores, it)
	home.UseGlobalShare(func() float64 { return 0.5 })
	if got := admit(t, other, int64(1e12), it, 8); got != 5 {
		t.Errorf("the home at share 0.5 admitted %d of 8 asked with the whole limit 10, want 5", got)
	}
	// A region limit is its region's alone: no share.
	rit := strongItem("k", 10, limit.ScopeRegion, limit.SlidingWindow)
	rhome, _ := homeAndOther(t, stores, rit)
	rhome.UseGlobalShare(func() float64 { return 0.5 })
	if got := admit(t, rhome, int64(1e12), rit, 12); got != 10 {
		t.Errorf("a region limit's home at share 0.5 admitted %d of 12, want the whole limit 10", got)
	}
}

// A home whose clock steps forward across a window boundary (the PoPs'
// clock agreement corrects a clock that ran behind) still holds the limit
// over the true time: the hits it admitted just before the step lie, by the
// new clock, in the new window, and count there (MoveClock). Without it
// they sit in the window before, which a sliding count forgets as the new
// window slides, and the home lets them in again (skew.yaml).
func TestStrongHomeClockStepsForward(t *testing.T) {
	const limitHits, w = 100, int64(time.Minute)
	for _, askHome := range []bool{true, false} {
		t.Run(fmt.Sprintf("asked by the home %v", askHome), func(t *testing.T) {
			_, stores := strongNet(t)
			it := strongItem("k", limitHits, limit.ScopeGlobal, limit.SlidingWindow)
			home, other := homeAndOther(t, stores, it)
			asker := other
			if askHome {
				asker = home
			}
			// True time starts at a window boundary S; the home's clock is
			// 0.3 w behind, then is corrected 0.08 w in.
			S := 1000 * w
			behind := 3 * w / 10
			admitted := 0
			for tt := S; tt < S+8*w/100; tt += w / 1000 { // 80 checks, all admitted
				admitted += admit(t, asker, tt-behind, it, 1)
			}
			if admitted != 80 {
				t.Fatalf("before the step: admitted %d of 80, within the limit %d", admitted, limitHits)
			}
			if err := home.MoveClock(context.Background(), S+8*w/100, behind); err != nil {
				t.Fatal(err)
			}
			for tt := S + 8*w/100; tt < S+w; tt += w / 1000 {
				admitted += admit(t, asker, tt, it, 1)
			}
			if admitted > limitHits {
				t.Errorf("admitted %d within one window of true time, limit %d", admitted, limitHits)
			}
			if admitted < limitHits-limitHits/homeGrains-1 {
				t.Errorf("admitted %d within the window, want the limit %d but for the hits counted twice", admitted, limitHits)
			}
		})
	}
}

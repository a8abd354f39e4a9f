package store

import (
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// A client that paused one hit short of an hour's limit gets that hit at
// any PoP once every PoP has heard every count: the guess of hits not heard
// yet, a fraction of one for replicas whose news says they admitted nothing
// more, withheld it for the rest of the hour everywhere (edgelimit demo: 4
// hits at one PoP, 5 at another, of 10 an hour).
func TestLastHitNotWithheldByAFractionOfAGuess(t *testing.T) {
	names := []string{"a", "b", "c"}
	st := make([]*Memory, len(names))
	for i := range st {
		st[i] = NewMemory(MemoryConfig{Replica: names[i], RegionPeers: names, Replicas: names, Extrapolate: true})
	}
	it := windowItem(rules.Hour, limit.SlidingWindow, limit.ScopeGlobal, 10, "alice")
	now := limittest.T0.Add(10 * time.Minute).UnixNano()
	step := int64(100 * time.Millisecond)
	if n := admit(t, st[0], now, it, 4); n != 4 {
		t.Fatalf("a admitted %d of 4", n)
	}
	now += step
	flushAt(now, st...)
	if n := admit(t, st[1], now, it, 5); n != 5 {
		t.Fatalf("b admitted %d of 5", n)
	}
	// Thirty seconds of news — a snapshot every 5 s, no delta with nothing
	// new — saying nothing more was admitted; the checks come between two
	// snapshots.
	for i := 1; i <= 325; i++ {
		now += step
		if i%50 == 0 {
			snapshotAt(now, st...)
		} else {
			publishedAt(now, st...)
		}
	}
	out := make([]limit.Decision, 1)
	for i, s := range st {
		if err := s.CheckAt(t.Context(), now, 0, []limit.Item{it}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Remaining != 1 {
			t.Errorf("%s: remaining %d after 9 of 10 everywhere heard, want 1", names[i], out[0].Remaining)
		}
	}
	if n := admit(t, st[2], now, it, 1); n != 1 {
		t.Fatal("c denied the tenth hit of 10 with 9 admitted and heard everywhere")
	}
}

// publishedAt delivers, as replication publishes them, the deltas of the
// stores that have one at now: a store with nothing new sends nothing.
func publishedAt(now int64, stores ...*Memory) {
	for i, s := range stores {
		d := s.DeltaAt(now)
		if len(d) == 0 {
			continue
		}
		for j, to := range stores {
			if i != j {
				to.ApplyAt(now, now, d)
			}
		}
	}
}

package store

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// replItem builds an item the way the engine does, so that its key carries
// its unit (rules.KeyWindow).
func replItem(value string, n int64, scope limit.Scope) limit.Item {
	return windowItem(rules.Minute, limit.SlidingWindow, scope, n, value)
}

// windowItem is the item of a limit of n per unit u with algorithm alg and
// scope, for the request value of descriptor key k.
func windowItem(u rules.Unit, alg limit.Algorithm, scope limit.Scope, n int64, value string) limit.Item {
	l := &rules.Limit{Domain: "d", Unit: u, Scope: scope,
		Spec: limit.Spec{Algorithm: alg, Limit: n, Window: int64(u.Duration())}}
	return limit.Item{Key: l.AppendKey(nil, []rules.Entry{{Key: "k", Value: value}}), Spec: l.Spec, Scope: scope}
}

// admit makes times single checks of it on any store and counts the admitted.
func admit(t *testing.T, s limittest.Store, now int64, it limit.Item, times int) int {
	t.Helper()
	out := make([]limit.Decision, 1)
	n := 0
	for range times {
		if err := s.CheckAt(context.Background(), now, 1, []limit.Item{it}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed {
			n++
		}
	}
	return n
}

// exchange delivers every store's delta to every other store.
func exchange(stores ...*Memory) {
	for i, from := range stores {
		d := from.Delta()
		for j, to := range stores {
			if i != j {
				to.Apply(0, d)
			}
		}
	}
}

func TestReplicatedScopes(t *testing.T) {
	// Region eu: a, b. Region us: c.
	a := NewMemory(MemoryConfig{Replica: "a", RegionPeers: []string{"b"}})
	b := NewMemory(MemoryConfig{Replica: "b", RegionPeers: []string{"a"}})
	c := NewMemory(MemoryConfig{Replica: "c"})
	now := limittest.T0.Add(10 * time.Second).UnixNano()

	global := replItem("g", 10, limit.ScopeGlobal)
	region := replItem("r", 10, limit.ScopeRegion)
	local := replItem("p", 10, limit.ScopePOP)

	if got := admit(t, a, now, global, 6) + admit(t, c, now, global, 2); got != 8 {
		t.Fatalf("admitted %d before any exchange", got)
	}
	exchange(a, b, c)
	// Every PoP now knows 8 of 10 are spent: only 2 more anywhere.
	if got := admit(t, b, now, global, 5); got != 2 {
		t.Fatalf("b admitted %d of the 2 left of the global limit", got)
	}
	exchange(a, b, c)
	if got := admit(t, a, now, global, 1) + admit(t, c, now, global, 1); got != 0 {
		t.Fatalf("global limit spent, yet %d admitted", got)
	}

	// Region scope: c's hits are in another region and do not count for eu.
	admit(t, a, now, region, 7)
	admit(t, c, now, region, 10)
	exchange(a, b, c)
	if got := admit(t, b, now, region, 5); got != 3 {
		t.Fatalf("b admitted %d of eu's 3 left", got)
	}

	// Pop scope is never replicated.
	admit(t, a, now, local, 10)
	exchange(a, b, c)
	if got := admit(t, b, now, local, 10); got != 10 {
		t.Fatalf("pop scope leaked across PoPs: b admitted %d", got)
	}
	if n := len(a.Own()); n == 0 {
		t.Fatal("a has no own replicated slots")
	}
	for _, sl := range a.Own() {
		if sl.Replica != "a" {
			t.Fatalf("own slot of replica %q", sl.Replica)
		}
	}
}

// The previous window counts with its sliding weight, remote hits included.
func TestReplicatedSlidingWindow(t *testing.T) {
	a := NewMemory(MemoryConfig{Replica: "a"})
	b := NewMemory(MemoryConfig{Replica: "b"})
	it := replItem("w", 100, limit.ScopeGlobal)
	t0 := limittest.T0.UnixNano()
	admit(t, a, t0+int64(10*time.Second), it, 40)
	admit(t, b, t0+int64(20*time.Second), it, 40)
	exchange(a, b)
	// 45 s into the next minute: 80 × 0.25 = 20 spent; 80 fit.
	if got := admit(t, a, t0+int64(105*time.Second), it, 100); got != 80 {
		t.Fatalf("admitted %d, want 80", got)
	}
}

// A restarted store counts what it restored, and never publishes less.
func TestReplicatedRestore(t *testing.T) {
	a := NewMemory(MemoryConfig{Replica: "a"})
	it := replItem("x", 10, limit.ScopeGlobal)
	now := limittest.T0.UnixNano()
	admit(t, a, now, it, 7)
	saved := a.Delta()
	restarted := NewMemory(MemoryConfig{Replica: "a"})
	restarted.Restore(saved)
	if got := admit(t, restarted, now, it, 10); got != 3 {
		t.Fatalf("restarted store admitted %d, want the 3 left", got)
	}
	for _, sl := range restarted.Delta() {
		if sl.Count < 7 {
			t.Fatalf("published %v below the 7 published before the restart", sl)
		}
	}
}

func TestReplicatedSweep(t *testing.T) {
	a := NewMemory(MemoryConfig{Replica: "a"})
	b := NewMemory(MemoryConfig{Replica: "b"})
	it := replItem("s", 10, limit.ScopeGlobal)
	t0 := limittest.T0.UnixNano()
	admit(t, a, t0, it, 3)
	exchange(a, b)
	if len(b.Remote()) != 1 {
		t.Fatalf("b remote %v", b.Remote())
	}
	a.SweepAt(t0 + int64(3*time.Minute))
	b.SweepAt(t0 + int64(3*time.Minute))
	if len(a.Own()) != 0 || len(b.Remote()) != 0 {
		t.Fatalf("windows older than the previous one survived: own %v remote %v", a.Own(), b.Remote())
	}
}

// TestApplyBatch: Apply hands Counters runs of slots, not one slot at a time;
// a batch that interleaves window lengths, own slots and keys whose window
// cannot be told must leave the same remote counts as its slots applied one
// by one, and large enough a batch to take Join's batch paths.
func TestApplyBatch(t *testing.T) {
	minute := func(v string) []byte { return replItem(v, 10, limit.ScopeGlobal).Key }
	hour := func(v string) []byte {
		l := &rules.Limit{Domain: "d", Unit: rules.Hour, Scope: limit.ScopeGlobal,
			Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: 10, Window: int64(time.Hour)}}
		return l.AppendKey(nil, []rules.Entry{{Key: "k", Value: v}})
	}
	var batch []crdt.Slot
	for i := range 3000 {
		v := strconv.Itoa(i % 1100)
		s := crdt.Slot{Key: string(minute(v)), Window: int64(time.Minute) * int64(i%3), Replica: "fra1", Count: uint64(i%7 + 1)}
		switch i % 10 {
		case 3:
			s.Key = string(hour(v))
		case 5:
			s.Replica = "self" // own: ignored
		case 7:
			s.Key = "no window in this key"
		case 8:
			s.Replica = "par1"
		}
		batch = append(batch, s)
	}
	one, all := NewMemory(MemoryConfig{Replica: "self"}), NewMemory(MemoryConfig{Replica: "self"})
	for i := range batch {
		one.Apply(0, batch[i:i+1])
	}
	all.Apply(0, batch)
	a, b := one.Remote(), all.Remote()
	if len(a) == 0 || !slices.Equal(a, b) {
		t.Fatalf("applied in one batch: %d remote slots; one by one: %d (or different ones)", len(b), len(a))
	}
	for _, s := range a {
		if s.Replica == "self" {
			t.Fatalf("own slot applied as remote: %v", s)
		}
	}
}

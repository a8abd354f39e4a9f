package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/region/escrow"
)

// boundedStores returns n replicating stores of one region, r0…r(n-1).
func boundedStores(n int) []*Memory {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("r%d", i)
	}
	out := make([]*Memory, n)
	for i := range out {
		out[i] = NewMemory(MemoryConfig{Replica: names[i], RegionPeers: names, Replicas: names})
	}
	return out
}

// flushAt delivers every store's delta at now to every other store.
func flushAt(now int64, stores ...*Memory) { deliverAt(now, (*Memory).DeltaAt, stores...) }

// snapshotAt delivers every store's snapshot at now to every other store:
// their watermarks, from which each takes the others' counts of the
// windows before now as final (in steady state, every snapshot interval).
func snapshotAt(now int64, stores ...*Memory) { deliverAt(now, (*Memory).OwnAt, stores...) }

// deliverAt takes what take says of every store at now, then delivers it,
// sent at now, to every other store.
func deliverAt(now int64, take func(*Memory, int64) []crdt.Slot, stores ...*Memory) {
	sent := make([][]crdt.Slot, len(stores))
	for i, s := range stores {
		sent[i] = take(s, now)
	}
	for i := range stores {
		for j, to := range stores {
			if i != j {
				to.ApplyAt(now, now, sent[i])
			}
		}
	}
}

func boundedItem(value string, n int64, scope limit.Scope, alg limit.Algorithm) limit.Item {
	it := windowItem(rules.Minute, alg, scope, n, value)
	it.Consistency = limit.Bounded
	return it
}

// A bounded limit holds each PoP to its allowance, which starts as an
// equal share and moves toward demand at each flush: before any exchange
// a PoP admits its share only, and after its demand is heard it admits what
// the others gave it — never, all PoPs together, past the limit.
func TestBoundedAllowanceMovesToDemand(t *testing.T) {
	for _, alg := range []limit.Algorithm{limit.SlidingWindow, limit.FixedWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			st := boundedStores(3)
			now := limittest.T0.Add(10 * time.Second).UnixNano()
			it := boundedItem("pinned", 90, limit.ScopeGlobal, alg)
			snapshotAt(now, st...)
			// A client pinned to r0: a third of the limit before anything moves.
			first := admit(t, st[0], now, it, 60)
			if first != 30 {
				t.Fatalf("r0 admitted %d of 60 before any flush, want its share 30", first)
			}
			total := first
			for round := range 4 {
				now += int64(100 * time.Millisecond)
				flushAt(now, st...)
				total += admit(t, st[0], now, it, 60)
				if total > 90 {
					t.Fatalf("round %d: %d admitted at r0, over the limit of 90", round, total)
				}
			}
			if total < 85 {
				t.Fatalf("r0 admitted %d of the 90 in four flushes: the others' shares did not move to it", total)
			}
			// Whatever is left anywhere, the three together stay within 90.
			for _, s := range st {
				total += admit(t, s, now, it, 50)
			}
			if total > 90 {
				t.Fatalf("%d admitted in all, over the limit of 90", total)
			}
		})
	}
}

// Before any flush, PoPs that all see the whole demand at once (a burst
// over every PoP) admit the limit and no more, where the eventual estimate
// has nothing to go on yet.
func TestBoundedBurstAcrossPoPs(t *testing.T) {
	st := boundedStores(6)
	now := limittest.T0.Add(time.Second).UnixNano()
	it := boundedItem("burst", 100, limit.ScopeGlobal, limit.SlidingWindow)
	snapshotAt(now, st...)
	total := 0
	for range 50 {
		for _, s := range st {
			total += admit(t, s, now, it, 1)
		}
	}
	if total > 100 {
		t.Fatalf("a burst of 300 over 6 PoPs admitted %d of a bounded 100", total)
	}
	if total < 96 { // 6 shares of ⌊100/6⌋ hits at least
		t.Fatalf("a burst of 300 over 6 PoPs admitted %d of a bounded 100, want its shares", total)
	}
}

// A request whose other limit denies it counts nothing of a bounded one
// (only its demand, which the others hear and give toward).
func TestBoundedDeniedRequestCountsNothing(t *testing.T) {
	st := boundedStores(2)
	now := limittest.T0.Add(time.Second).UnixNano()
	b := boundedItem("b", 10, limit.ScopeGlobal, limit.FixedWindow)
	strict := windowItem(rules.Minute, limit.FixedWindow, limit.ScopePOP, 1, "strict")
	out := make([]limit.Decision, 2)
	for range 3 {
		if err := st[0].CheckAt(context.Background(), now, 1, []limit.Item{b, strict}, out); err != nil {
			t.Fatal(err)
		}
	}
	// One admitted (strict's limit of 1), two denied by strict.
	var count, req uint64
	for _, sl := range st[0].DeltaAt(now) {
		if !escrow.IsSlot(sl) {
			continue
		}
		it, err := escrow.DecodeSlot(sl)
		if err != nil {
			t.Fatal(err)
		}
		switch it.Kind {
		case escrow.Count:
			count = it.Value
		case escrow.Requested:
			req = it.Value
		}
	}
	if count != 1 || req != 3 {
		t.Fatalf("published count %d and requested %d, want 1 admitted of 3 requested", count, req)
	}
}

// Escrow slots never reach the ordinary counts: a store that receives a
// bounded limit's counters counts none of them against the eventual limit
// of the same key bytes, and a store on Redis ignores them.
func TestBoundedSlotsStayOutOfCounts(t *testing.T) {
	st := boundedStores(2)
	now := limittest.T0.Add(time.Second).UnixNano()
	b := boundedItem("same", 10, limit.ScopeGlobal, limit.FixedWindow)
	if got := admit(t, st[0], now, b, 5); got != 5 {
		t.Fatalf("admitted %d of r0's share 5", got)
	}
	flushAt(now, st...)
	eventual := b
	eventual.Consistency = limit.Eventual
	if got := admit(t, st[1], now, eventual, 10); got != 10 {
		t.Fatalf("the eventual limit of the same key admitted %d of 10: bounded counters leaked into its counts", got)
	}
	for _, sl := range st[1].Remote() {
		if escrow.IsSlot(sl) || escrow.IsNews(sl) {
			t.Fatalf("remote counts hold an escrow slot %v", sl)
		}
	}
}

// Until a PoP has heard the others' watermarks since a window began, the
// sliding window counts their allowance of the previous window as spent:
// early in a window it admits less, never more. A snapshot lifts it.
func TestBoundedSlidingBeforeWatermarks(t *testing.T) {
	st := boundedStores(3)
	now := limittest.T0.Add(6 * time.Second).UnixNano() // a tenth into the minute
	it := boundedItem("early", 90, limit.ScopeGlobal, limit.SlidingWindow)
	early := admit(t, st[0], now, it, 30)
	// Its third of (90 − 60·0.9) = 12, the others' two thirds of the
	// previous window counted as spent; the ledger rounds the elapsed
	// fraction down and the bound up, so 11.
	if early != 11 {
		t.Fatalf("admitted %d before any watermark, want 11", early)
	}
	snapshotAt(now, st...)
	if got := early + admit(t, st[0], now, it, 30); got != 30 {
		t.Fatalf("admitted %d in all after the watermarks, want the share 30", got)
	}
}

// A check of more hits than the limit (the engine's peek) is no demand: it
// publishes no requested hits, so no allowance moves toward it.
func TestBoundedPeekIsNoDemand(t *testing.T) {
	st := boundedStores(2)
	now := limittest.T0.Add(time.Second).UnixNano()
	it := boundedItem("peeked", 10, limit.ScopeGlobal, limit.FixedWindow)
	out := make([]limit.Decision, 1)
	if err := st[0].CheckAt(context.Background(), now, 11, []limit.Item{it}, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Allowed || out[0].Remaining != 5 {
		t.Fatalf("a peek of 11 hits: %+v, want denied with r0's 5 of room", out[0])
	}
	for _, sl := range st[0].DeltaAt(now) {
		if escrow.IsSlot(sl) {
			t.Fatalf("a peek published %v", sl)
		}
	}
}

// BenchmarkBoundedCheck is a check of one bounded global limit on a store of
// ten replicas that has heard the others' snapshots: the ledger's peek, the
// decision and the count (BenchmarkReplicatedCheck is the eventual one).
func BenchmarkBoundedCheck(b *testing.B) {
	for _, alg := range []limit.Algorithm{limit.FixedWindow, limit.SlidingWindow} {
		b.Run(alg.String(), func(b *testing.B) {
			st := boundedStores(10)
			now := limittest.T0.Add(30 * time.Second).UnixNano()
			snapshotAt(now, st...)
			it := boundedItem("bench", 1<<40, limit.ScopeGlobal, alg)
			items := []limit.Item{it}
			out := make([]limit.Decision, 1)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				_ = st[0].CheckAt(ctx, now+int64(i), 1, items, out)
			}
		})
	}
}

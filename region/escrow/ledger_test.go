package escrow

import (
	"errors"
	"testing"
)

// trio returns ledgers a, b and c of one scope, each started at inc.
func trio(t *testing.T, inc int64) (a, b, c *Ledger) {
	t.Helper()
	mk := func(self string) *Ledger {
		l, err := New(Config{Self: self, Replicas: []string{"c", "a", "b"}, Incarnation: inc})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	return mk("a"), mk("b"), mk("c")
}

// send applies everything from has published, with its watermark at now, to
// each of to.
func send(t *testing.T, now int64, from *Ledger, to ...*Ledger) {
	t.Helper()
	n, items := from.Own(now)
	for _, l := range to {
		if err := l.Apply(n, items); err != nil {
			t.Fatal(err)
		}
	}
}

// step is one instant of a table: what happens, and what is expected.
type step struct {
	name string
	at   int64
	do   func(t *testing.T, at int64)
}

func run(t *testing.T, steps []step) {
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) { s.do(t, s.at) })
		if t.Failed() {
			return
		}
	}
}

func decide(l *Ledger, key string, spec Spec, hits int64, want bool, wantRemaining int64) func(*testing.T, int64) {
	return func(t *testing.T, at int64) {
		t.Helper()
		got, rem := l.Decide(at, key, spec, hits)
		if got != want || rem != wantRemaining {
			t.Fatalf("%s: Decide(%d, %q, hits=%d) = %v, %d; want %v, %d", l.Self(), at, key, hits, got, rem, want, wantRemaining)
		}
	}
}

func held(l *Ledger, key string, window int64, want uint64) func(*testing.T, int64) {
	return func(t *testing.T, _ int64) {
		t.Helper()
		if got := l.Held(key, Spec{Limit: 1, Window: sec}, window); got != want {
			t.Fatalf("%s: Held(%q, %d) = %d, want %d", l.Self(), key, window, got, want)
		}
	}
}

func rebalance(l *Ledger, wantGives int) func(*testing.T, int64) {
	return func(t *testing.T, at int64) {
		t.Helper()
		if g := l.Rebalance(at); len(g) != wantGives {
			t.Fatalf("%s: Rebalance(%d) made %d gives %v, want %d", l.Self(), at, len(g), g, wantGives)
		}
	}
}

func sync(from *Ledger, to ...*Ledger) func(*testing.T, int64) {
	return func(t *testing.T, at int64) { send(t, at, from, to...) }
}

// The instants of the tables (t0…t8), the windows they fall in (w0…w2), and
// the start shares of three replicas: a, first by name, holds the remainder.
const (
	share = S / 3
	shA   = share + S%3
	L100  = int64(100)
	w0    = int64(0)
	w1    = sec
	w2    = 2 * sec
	t0    = 0
	t1    = 100 * ms
	t2    = 200 * ms
	t3    = 300 * ms
	t4    = 400 * ms
	t5    = 900 * ms
	t6    = sec
	t8    = sec + 500*ms
)

// A client pinned to a: a starts with a third; b and c, on hearing its
// demand, give it their shares of this window and pre-give their shares of
// the next, which a then starts with whole.
func TestPinned(t *testing.T) {
	a, b, c := trio(t, 0)
	spec := Spec{Limit: L100, Window: sec}
	run(t, []step{
		{"t0 a admits its third", t0, decide(a, "k", spec, 30, true, 3)},
		{"t0 a denies past its third", t0, decide(a, "k", spec, 10, false, 3)},
		{"t0 b holds its third", t0, held(b, "k", w0, share)},
		{"t1 a publishes", t1, sync(a, b, c)},
		{"t2 b gives now and for the next window", t2, rebalance(b, 2)},
		{"t2 c gives now and for the next window", t2, rebalance(c, 2)},
		{"t2 b holds nothing", t2, held(b, "k", w0, 0)},
		{"t2 b denies", t2, decide(b, "k", spec, 1, false, 0)},
		{"t2 a holds a third still", t2, held(a, "k", w0, shA)},
		{"t3 b publishes", t3, sync(b, a)},
		{"t3 c publishes", t3, sync(c, a)},
		{"t3 a holds the whole limit", t3, held(a, "k", w0, S)},
		{"t3 a admits the rest", t3, decide(a, "k", spec, 70, true, 0)},
		{"t3 a denies past the limit", t3, decide(a, "k", spec, 1, false, 0)},
		{"t4 a gives nothing", t4, rebalance(a, 0)},
		{"t6 a starts the next window whole", t6, held(a, "k", w1, S)},
		{"t6 a admits the limit at once", t6, decide(a, "k", spec, 100, true, 0)},
	})
}

// A sprayer at the same rate on every replica: the targets equal the start
// shares, and nobody gives.
func TestSprayer(t *testing.T) {
	a, b, c := trio(t, 0)
	spec := Spec{Limit: L100, Window: sec}
	all := []*Ledger{a, b, c}
	var steps []step
	for _, l := range all {
		steps = append(steps, step{l.Self() + " admits 20", t1, decide(l, "k", spec, 20, true, 13)})
	}
	steps = append(steps,
		step{"t2 a publishes", t2, sync(a, b, c)},
		step{"t2 b publishes", t2, sync(b, a, c)},
		step{"t2 c publishes", t2, sync(c, a, b)},
	)
	for _, l := range all {
		steps = append(steps, step{l.Self() + " gives nothing", t3, rebalance(l, 0)})
	}
	steps = append(steps,
		step{"t3 a holds its start share", t3, held(a, "k", w0, shA)},
		step{"t3 c holds its start share", t3, held(c, "k", w0, share)},
		step{"t6 c holds its start share of the next window", t6, held(c, "k", w1, share)},
	)
	run(t, steps)
}

// A replica that restarts holds nothing of a window that began before its
// restart — neither its start share nor what was given to its previous
// incarnation — and gets allowance like a newcomer, from gives addressed to
// its new incarnation. Windows that begin after the restart start as usual.
func TestRestarted(t *testing.T) {
	a, b, c := trio(t, 0)
	spec := Spec{Limit: L100, Window: sec}
	var a2 *Ledger
	restart := func(t *testing.T, at int64) {
		_, saved := a.Own(at)
		var err error
		if a2, err = New(Config{Self: "a", Replicas: []string{"a", "b", "c"}, Incarnation: at}); err != nil {
			t.Fatal(err)
		}
		if err := a2.Restore(saved); err != nil {
			t.Fatal(err)
		}
	}
	run(t, []step{
		{"t0 a admits its third", t0, decide(a, "k", spec, 30, true, 3)},
		{"t1 a publishes", t1, sync(a, b, c)},
		{"t2 b gives to a", t2, rebalance(b, 2)},
		{"t3 b publishes", t3, sync(b, a)},
		{"t3 a holds two thirds", t3, held(a, "k", w0, shA+share)},
		{"t4 a restarts", t4, restart},
		{"t4 a holds nothing of the crash window", t4, func(t *testing.T, _ int64) { held(a2, "k", w0, 0)(t, 0) }},
		{"t4 a denies in the crash window", t4, func(t *testing.T, at int64) { decide(a2, "k", spec, 1, false, 0)(t, at) }},
		{"t4 a keeps its start share of the next window", t4, func(t *testing.T, _ int64) { held(a2, "k", w1, shA)(t, 0) }},
		{"t4 b publishes again", t4, func(t *testing.T, at int64) { send(t, at, b, a2) }},
		{"t4 and b's pre-give to the previous incarnation", t4, func(t *testing.T, _ int64) {
			held(a2, "k", w1, shA+share)(t, 0)
		}},
		{"t4 but not b's give of the crash window", t4, func(t *testing.T, _ int64) { held(a2, "k", w0, 0)(t, 0) }},
		{"t5 a publishes", t5, func(t *testing.T, at int64) { send(t, at, a2, b, c) }},
		{"t5 c gives to the new a", t5, rebalance(c, 2)},
		{"t5 c publishes", t5, func(t *testing.T, at int64) { send(t, at, c, a2) }},
		{"t5 the new a holds c's give only", t5, func(t *testing.T, _ int64) { held(a2, "k", w0, share)(t, 0) }},
		{"t5 the new a admits within it", t5, func(t *testing.T, at int64) { decide(a2, "k", spec, 33, true, 0)(t, at) }},
		{"t5 and no more", t5, func(t *testing.T, at int64) { decide(a2, "k", spec, 1, false, 0)(t, at) }},
	})
}

// P̂, the bound of the previous window's total that the sliding window
// subtracts, is pessimistic until every replica has been heard from since
// the boundary, and exact once they have.
func TestPrevBoundFinality(t *testing.T) {
	a, b, c := trio(t, -10*sec)
	spec := Spec{Limit: L100, Window: sec, Sliding: true}
	// At t6 = 1s, e = 0: a's own 30 are final, b's and c's two thirds are
	// not: P̂ = 30 + ⌈100·2/3⌉ = 97, the room 3, a's third of it 1. With b
	// heard since the boundary, P̂ = 40 + ⌈100/3⌉ = 74: room 26, a's third
	// 8. With c too, P̂ = 40: room 60, a's third 20; half a window later the
	// room is 100 − 40/2 = 80, a's third 26.
	run(t, []step{
		{"t0 a publishes", t0, sync(a, b, c)},
		{"t0 b publishes", t0, sync(b, a, c)},
		{"t0 c publishes", t0, sync(c, a, b)},
		{"t0 a admits 30", t0, decide(a, "k", spec, 30, true, 3)},
		{"t1 b admits 10", t1, decide(b, "k", spec, 10, true, 23)},
		{"t5 b publishes before the boundary", t5, sync(b, a)},
		{"t6 a counts b and c at their shares", t6, decide(a, "k", spec, 0, true, 1)},
		{"t6 b publishes after the boundary", t6, sync(b, a)},
		{"t6 a counts b exactly, c at its share", t6, decide(a, "k", spec, 0, true, 8)},
		{"t6 c publishes after the boundary", t6, sync(c, a)},
		{"t6 a counts everyone exactly", t6, decide(a, "k", spec, 0, true, 20)},
		{"t8 half the window later", t8, decide(a, "k", spec, 0, true, 26)},
	})
}

func TestApplyRejects(t *testing.T) {
	a, _, _ := trio(t, 0)
	spec := Spec{Limit: 10, Window: sec}
	for _, tc := range []struct {
		name string
		it   Item
		want error
	}{
		{"unknown replica", Item{Kind: Count, Key: "k", Spec: spec, Replica: "x", Value: 1}, ErrUnknownReplica},
		{"count over limit", Item{Kind: Count, Key: "k", Spec: spec, Replica: "b", Value: 11}, ErrBadItem},
		{"give to unknown", Item{Kind: Give, Key: "k", Spec: spec, Replica: "b", To: "x", Value: 1}, ErrUnknownReplica},
		{"unaligned window", Item{Kind: Count, Key: "k", Window: 1, Spec: spec, Replica: "b", Value: 1}, ErrBadItem},
		{"bad spec", Item{Kind: Count, Key: "k", Spec: Spec{Limit: 0, Window: sec}, Replica: "b", Value: 1}, ErrBadSpec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := a.Apply(News{From: "b"}, []Item{tc.it}); !errors.Is(err, tc.want) {
				t.Fatalf("Apply(%v) = %v, want %v", tc.it, err, tc.want)
			}
		})
	}
	if err := a.Heard(News{From: "x"}); !errors.Is(err, ErrUnknownReplica) {
		t.Fatalf("Heard from x = %v", err)
	}
	if err := a.Restore([]Item{{Kind: Count, Key: "k", Spec: spec, Replica: "b", Value: 1}}); !errors.Is(err, ErrNotOwn) {
		t.Fatalf("Restore of b's item = %v", err)
	}
}

func TestNewRejects(t *testing.T) {
	for _, cfg := range []Config{
		{Self: "a"},
		{Self: "a", Replicas: []string{"b"}},
		{Self: "a", Replicas: []string{"a", "a"}},
		{Self: "a", Replicas: []string{"a", ""}},
		{Self: "a", Replicas: []string{"a", "b\x00"}},
		{Self: "a", Replicas: []string{"a", "b", "c"}, Scale: 2},
		{Self: "a", Replicas: []string{"a"}, Scale: MaxScale + 1},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
}

// Delta hands out what changed since the last Delta, absolute; Prune drops
// old windows and refuses to bring them back.
func TestDeltaAndPrune(t *testing.T) {
	a, b, _ := trio(t, 0)
	spec := Spec{Limit: 10, Window: sec}
	a.Decide(t1, "k", spec, 2)
	a.Decide(t1, "j", spec, 1)
	if _, items := a.Delta(t1); len(items) != 4 {
		t.Fatalf("first Delta = %v, want count and requested of j and k", items)
	}
	if _, items := a.Delta(t2); len(items) != 0 {
		t.Fatalf("second Delta = %v, want nothing", items)
	}
	a.Decide(t2, "k", spec, 1)
	n, items := a.Delta(t3)
	want := []Item{
		{Kind: Count, Key: "k", Window: w0, Spec: spec, Replica: "a", Value: 3},
		{Kind: Requested, Key: "k", Window: w0, Spec: spec, Replica: "a", Value: 3},
	}
	if n != (News{From: "a", Incarnation: 0, SentAt: t3}) || len(items) != 2 || items[0] != want[0] || items[1] != want[1] {
		t.Fatalf("Delta = %v %v, want %v", n, items, want)
	}
	if err := b.Apply(n, items); err != nil {
		t.Fatal(err)
	}
	if got := b.Prune(w2 + 1); got != 1 {
		t.Fatalf("Prune dropped %d, want 1", got)
	}
	if err := b.Apply(n, items); err != nil || b.Len() != 0 {
		t.Fatalf("a pruned window came back: %v, %d held", err, b.Len())
	}
	if ok, _ := b.Decide(t3, "k", spec, 1); ok {
		t.Fatal("admitted in a pruned window")
	}
}

// A replica that used gives and crashed before it published what it
// admitted must not use them again after its restart: the gives were
// addressed to its previous incarnation, which is taken to have used all it
// held. (Counting them again — a start share of 0 but every give heard —
// would let this window admit 166 of 100.)
func TestRestartAfterGives(t *testing.T) {
	a, b, c := trio(t, -10*sec)
	spec := Spec{Limit: L100, Window: sec}
	var saved []Item
	var a2 *Ledger
	run(t, []step{
		{"t0 a admits its third", t0, decide(a, "k", spec, 30, true, 3)},
		{"t1 a saves and publishes", t1, func(t *testing.T, at int64) {
			_, saved = a.Own(at)
			send(t, at, a, b, c)
		}},
		{"t2 b gives to a", t2, rebalance(b, 2)},
		{"t2 c gives to a", t2, rebalance(c, 2)},
		{"t3 b publishes", t3, sync(b, a)},
		{"t3 c publishes", t3, sync(c, a)},
		{"t3 a admits the rest, unsaved", t3, decide(a, "k", spec, 70, true, 0)},
		{"t4 a crashes and restarts", t4, func(t *testing.T, at int64) {
			var err error
			if a2, err = New(Config{Self: "a", Replicas: []string{"a", "b", "c"}, Incarnation: at}); err != nil {
				t.Fatal(err)
			}
			if err := a2.Restore(saved); err != nil {
				t.Fatal(err)
			}
			send(t, at, b, a2)
			send(t, at, c, a2)
		}},
		{"t4 the new a holds nothing of the window", t4, func(t *testing.T, _ int64) { held(a2, "k", w0, 0)(t, 0) }},
		{"t4 and admits nothing", t4, func(t *testing.T, at int64) { decide(a2, "k", spec, 1, false, 0)(t, at) }},
		{"t6 the next window is the new a's whole", t6, func(t *testing.T, at int64) { decide(a2, "k", spec, 100, true, 0)(t, at) }},
	})
}

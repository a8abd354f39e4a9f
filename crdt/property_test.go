package crdt_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/crdt/crdttest"
)

var seedFlag = flag.Uint64("seed", 0, "seed of the property tests (0: pick one from the clock and print it on failure)")

// newRand returns the test's random source. The seed comes from -seed or the
// clock; a failing test prints it with the command that replays the run.
func newRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d; replay with: go test ./crdt -run '^%s$' -seed %d", seed, t.Name(), seed)
		}
	})
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
}

// randomSpace draws a small space so that slots collide often.
func randomSpace(r *rand.Rand) crdttest.Space {
	return crdttest.Space{
		Keys:     1 + r.IntN(6),
		Windows:  1 + r.IntN(3),
		Replicas: 1 + r.IntN(5),
		Start:    w0,
		MaxCount: 1 + r.Uint64N(50),
	}
}

// naiveJoin is the join written the obvious way: per (key, window, replica)
// the maximum count, zero counts absent, returned in CompareSlots order.
func naiveJoin(lists ...[]crdt.Slot) []crdt.Slot {
	type cell struct {
		key     string
		window  int64
		replica string
	}
	max := map[cell]uint64{}
	for _, l := range lists {
		for _, s := range l {
			c := cell{s.Key, s.Window, s.Replica}
			if s.Count > max[c] {
				max[c] = s.Count
			}
		}
	}
	var out []crdt.Slot
	for c, n := range max {
		out = append(out, crdt.Slot{Key: c.key, Window: c.window, Replica: c.replica, Count: n})
	}
	slices.SortFunc(out, crdt.CompareSlots)
	return out
}

func shuffled(r *rand.Rand, s []crdt.Slot) []crdt.Slot {
	s = slices.Clone(s)
	r.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return s
}

// joinStates returns a new Counters holding the join of the given states.
func joinStates(cs ...*crdt.Counters) *crdt.Counters {
	var out crdt.Counters
	for _, c := range cs {
		out.Join(c.Slots()...)
	}
	return &out
}

func TestJoinLaws(t *testing.T) {
	r := newRand(t)
	for trial := range 300 {
		sp := randomSpace(r)
		a := crdttest.FromSlots(crdttest.RandomSlots(r, r.IntN(40), sp)...)
		b := crdttest.FromSlots(crdttest.RandomSlots(r, r.IntN(40), sp)...)
		c := crdttest.FromSlots(crdttest.RandomSlots(r, r.IntN(40), sp)...)

		// Commutative: a ⊔ b = b ⊔ a.
		if err := crdttest.Converged(joinStates(a, b), joinStates(b, a)); err != nil {
			t.Fatalf("trial %d: not commutative: %v", trial, err)
		}
		// Associative: (a ⊔ b) ⊔ c = a ⊔ (b ⊔ c).
		if err := crdttest.Converged(joinStates(joinStates(a, b), c), joinStates(a, joinStates(b, c))); err != nil {
			t.Fatalf("trial %d: not associative: %v", trial, err)
		}
		// Idempotent: a ⊔ a = a, and joining a's slots into a changes nothing.
		if err := crdttest.Converged(joinStates(a, a), a); err != nil {
			t.Fatalf("trial %d: not idempotent: %v", trial, err)
		}
		if n := a.Join(a.Slots()...); n != 0 {
			t.Fatalf("trial %d: joining a's own state changed %d slots", trial, n)
		}
	}
}

// TestJoinMatchesNaive checks Join against the obvious per-slot maximum, in
// any order and with any batching, and Total against a plain sum.
func TestJoinMatchesNaive(t *testing.T) {
	r := newRand(t)
	for trial := range 300 {
		sp := randomSpace(r)
		slots := crdttest.RandomSlots(r, r.IntN(80), sp)
		want := naiveJoin(slots)

		var c crdt.Counters
		for rest := shuffled(r, slots); len(rest) > 0; {
			n := 1 + r.IntN(len(rest))
			c.Join(rest[:n]...)
			rest = rest[n:]
		}
		if err := crdttest.DiffSlots(c.Slots(), want); err != nil {
			t.Fatalf("trial %d: join differs from naive max: %v", trial, err)
		}
		if c.Len() != len(want) {
			t.Fatalf("trial %d: Len() = %d, want %d", trial, c.Len(), len(want))
		}
		type cell struct {
			key    string
			window int64
		}
		sums := map[cell]uint64{}
		for _, s := range want {
			sums[cell{s.Key, s.Window}] += s.Count
		}
		for k, sum := range sums {
			if got := c.Total(k.key, k.window, nil); got != sum {
				t.Fatalf("trial %d: Total(%q, %d) = %d, want %d", trial, k.key, k.window, got, sum)
			}
		}
		for _, s := range want {
			if got := c.Replica(s.Key, s.Window, s.Replica); got != s.Count {
				t.Fatalf("trial %d: Replica(%v) = %d", trial, s, got)
			}
		}
	}
}

// TestReplicasConverge is the headline property: replicas count with Local,
// their deltas reach every receiver through a transport that drops,
// duplicates and reorders, one anti-entropy exchange per receiver repairs
// what was lost, and then every receiver holds the exact totals and all
// receivers hold the same state. In "drop windows" the replicas and the
// receivers also drop the oldest windows at random moments, and late deltas
// for them must not come back.
func TestReplicasConverge(t *testing.T) {
	for _, dropWindows := range []bool{false, true} {
		name := "keep windows"
		if dropWindows {
			name = "drop windows"
		}
		t.Run(name, func(t *testing.T) {
			r := newRand(t)
			for trial := range 300 {
				if err := convergeTrial(r, dropWindows); err != "" {
					t.Fatalf("trial %d: %s", trial, err)
				}
			}
		})
	}
}

func convergeTrial(r *rand.Rand, dropWindows bool) string {
	sp := randomSpace(r)
	sp.Windows = 1 + r.IntN(4)
	nReplicas, nReceivers := sp.Replicas, 1+r.IntN(5)
	horizon := sp.Window(r.IntN(sp.Windows + 1)) // windows before it get dropped

	locals := make([]*crdt.Local, nReplicas)
	for i := range locals {
		locals[i] = crdt.NewLocal(sp.Replica(i))
	}
	var oracle crdttest.Oracle
	var batches [][]crdt.Slot
	for range r.IntN(400) {
		l := locals[r.IntN(nReplicas)]
		switch op := r.IntN(20); {
		case op < 3:
			if d := l.Delta(); d != nil {
				batches = append(batches, d)
			}
		case op == 3 && dropWindows:
			l.DropBefore(horizon)
		default:
			key, window, n := sp.Key(r.IntN(sp.Keys)), sp.Window(r.IntN(sp.Windows)), r.Uint64N(4)
			if l.Add(key, window, n) > 0 || n == 0 {
				oracle.Add(key, window, n)
			}
		}
	}
	// Sometimes every replica flushes at the end; otherwise the counts since
	// a replica's last flush reach the receivers only through anti-entropy.
	flushedAll := r.IntN(2) == 0
	if flushedAll {
		for _, l := range locals {
			if d := l.Delta(); d != nil {
				batches = append(batches, d)
			}
		}
	}
	faults := crdttest.Faults{Drop: r.Float64() * 0.6, Duplicate: r.Float64() * 0.6, Reorder: true}
	if r.IntN(3) == 0 {
		faults.Drop = 0
	}
	if dropWindows {
		oracle.DropBefore(horizon)
	}

	receivers := make([]*crdt.Counters, nReceivers)
	for i := range receivers {
		c := new(crdt.Counters)
		receivers[i] = c
		delivered := crdttest.Deliver(r, batches, faults)
		dropAt := r.IntN(len(delivered) + 1)
		for j, b := range delivered {
			if dropWindows && j == dropAt {
				c.DropBefore(horizon)
			}
			c.Join(b...)
		}
		if dropWindows {
			c.DropBefore(horizon)
		}
		// Before any repair a receiver may know too little, never too much.
		for _, s := range c.Slots() {
			if got, exact := c.Total(s.Key, s.Window, nil), oracle.Sum(s.Key, s.Window); got > exact {
				return fmt.Sprintf("receiver %d overcounts key=%q window=%d: %d > %d", i, s.Key, s.Window, got, exact)
			}
		}
		// Without losses, and with everything flushed, no repair is needed.
		if faults.Drop == 0 && flushedAll {
			if err := oracle.Check(c); err != nil {
				return fmt.Sprintf("receiver %d before anti-entropy, lossless transport: %v", i, err)
			}
		}
	}

	// One anti-entropy exchange per receiver: the full state of every replica,
	// or of a receiver that already had its exchange.
	for i, c := range receivers {
		if i == 0 || r.IntN(2) == 0 {
			for _, l := range shuffledLocals(r, locals) {
				c.Join(l.Slots()...)
			}
		} else {
			c.Join(receivers[r.IntN(i)].Slots()...)
		}
	}

	for i, c := range receivers {
		if err := oracle.Check(c); err != nil {
			return fmt.Sprintf("receiver %d after anti-entropy: %v", i, err)
		}
		if err := crdttest.Converged(receivers[0], c); err != nil {
			return fmt.Sprintf("receivers 0 and %d differ: %v", i, err)
		}
		for _, l := range locals {
			for _, s := range l.Slots() {
				if s.Window >= horizon || !dropWindows {
					if got := c.Replica(s.Key, s.Window, s.Replica); got != s.Count {
						return fmt.Sprintf("receiver %d holds %d for %v", i, got, s)
					}
				}
			}
		}
	}
	return ""
}

func shuffledLocals(r *rand.Rand, ls []*crdt.Local) []*crdt.Local {
	ls = slices.Clone(ls)
	r.Shuffle(len(ls), func(i, j int) { ls[i], ls[j] = ls[j], ls[i] })
	return ls
}

// TestLocalMonotonic drives a Local through random Adds, Deltas, Restores,
// window drops and restarts (a new Local restored from what was persisted at
// the last flush, as the driver does), and checks that no value it publishes
// for a (key, window) is ever lower than one it published before, and that
// its counts match a model.
func TestLocalMonotonic(t *testing.T) {
	r := newRand(t)
	type cell struct {
		key    string
		window int64
	}
	for trial := range 200 {
		sp := randomSpace(r)
		sp.Windows = 1 + r.IntN(4)
		l := crdt.NewLocal("me")
		published := map[cell]uint64{}
		model := map[cell]uint64{} // what l should hold
		var persisted []crdt.Slot
		var floor int64
		floored := false
		below := func(w int64) bool { return floored && w < floor }

		for step := range r.IntN(300) {
			switch op := r.IntN(20); {
			case op < 4: // flush: persist, then publish
				d := l.Delta()
				persisted = l.Slots()
				for i, s := range d {
					if i > 0 && crdt.CompareSlots(d[i-1], s) >= 0 {
						t.Fatalf("trial %d step %d: Delta not strictly ordered: %v", trial, step, d)
					}
					c := cell{s.Key, s.Window}
					if s.Replica != "me" || s.Count == 0 {
						t.Fatalf("trial %d step %d: Delta published %v", trial, step, s)
					}
					if s.Count < published[c] {
						t.Fatalf("trial %d step %d: published %v after %d", trial, step, s, published[c])
					}
					published[c] = s.Count
				}
			case op == 4: // restore from arbitrary saved slots, ours and others'
				saved := crdttest.RandomSlots(r, r.IntN(5), sp)
				for i := range saved {
					if r.IntN(3) > 0 {
						saved[i].Replica = "me"
					}
				}
				l.Restore(saved...)
				for _, s := range saved {
					if c := (cell{s.Key, s.Window}); s.Replica == "me" && !below(s.Window) && s.Count > model[c] {
						model[c] = s.Count
					}
				}
			case op == 5: // crash and restart from the last persisted state
				l = crdt.NewLocal("me")
				l.Restore(persisted...)
				if floored {
					l.DropBefore(floor) // the driver drops to the current horizon after restoring
				}
				clear(model)
				for _, s := range persisted {
					if !below(s.Window) {
						model[cell{s.Key, s.Window}] = s.Count
					}
				}
			case op == 6: // window rollover
				w := sp.Window(r.IntN(sp.Windows))
				l.DropBefore(w)
				if !floored || w > floor {
					floor, floored = w, true
				}
				for c := range model {
					if below(c.window) {
						delete(model, c)
					}
				}
			default:
				c := cell{sp.Key(r.IntN(sp.Keys)), sp.Window(r.IntN(sp.Windows))}
				n := r.Uint64N(5)
				got := l.Add(c.key, c.window, n)
				if !below(c.window) {
					model[c] += n
				}
				if model[c] == 0 {
					delete(model, c)
				}
				if got != model[c] {
					t.Fatalf("trial %d step %d: Add(%q, %d, %d) = %d, model %d", trial, step, c.key, c.window, n, got, model[c])
				}
			}
			if l.Len() != len(model) {
				t.Fatalf("trial %d step %d: Len() = %d, model holds %d", trial, step, l.Len(), len(model))
			}
		}
		for c, n := range model {
			if got := l.Count(c.key, c.window); got != n {
				t.Fatalf("trial %d: Count(%q, %d) = %d, model %d", trial, c.key, c.window, got, n)
			}
		}
	}
}

func TestBitsJoinLaws(t *testing.T) {
	r := newRand(t)
	from := func(bits []crdt.Bit) *crdt.Bits {
		var s crdt.Bits
		s.Join(bits...)
		return &s
	}
	join := func(xs ...*crdt.Bits) *crdt.Bits {
		var s crdt.Bits
		for _, x := range xs {
			s.Join(x.All()...)
		}
		return &s
	}
	for trial := range 300 {
		sp := randomSpace(r)
		a := from(crdttest.RandomBits(r, r.IntN(30), sp))
		b := from(crdttest.RandomBits(r, r.IntN(30), sp))
		c := from(crdttest.RandomBits(r, r.IntN(30), sp))
		if err := crdttest.BitsConverged(join(a, b), join(b, a)); err != nil {
			t.Fatalf("trial %d: not commutative: %v", trial, err)
		}
		if err := crdttest.BitsConverged(join(join(a, b), c), join(a, join(b, c))); err != nil {
			t.Fatalf("trial %d: not associative: %v", trial, err)
		}
		if n := a.Join(a.All()...); n != 0 {
			t.Fatalf("trial %d: joining a's own bits changed %d", trial, n)
		}
		// Every held bit is the maximum of what was joined for its register.
		for _, x := range join(a, b).All() {
			for _, y := range append(a.All(), b.All()...) {
				if y.Key == x.Key && y.Scope == x.Scope && (y.Until > x.Until || y.Until == x.Until && y.Origin > x.Origin) {
					t.Fatalf("trial %d: held %v, but %v was joined", trial, x, y)
				}
			}
		}
	}
}

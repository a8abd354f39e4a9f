package escrow

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

var (
	seedFlag  = flag.Uint64("seed", 0, "run TestProperty with this one seed only")
	seedsFlag = flag.Int("seeds", 150, "how many seeds TestProperty runs per variant")
	heldFlag  = flag.Bool("held", true, "TestProperty checks the fractions held (a) besides the admissions (b)")
)

// randomParams draws one scenario: 2 to 8 replicas, a few keys with fixed
// and sliding windows and small and larger limits, every kind of client, a
// network that loses, duplicates, delays and reorders, partitions and
// crash-restarts.
func randomParams(seed uint64, skew int64, fifo bool) simParams {
	rng := rand.New(rand.NewPCG(seed, 7))
	p := simParams{
		seed:     seed,
		n:        2 + int(seed%7),
		flush:    (50 + rng.Int64N(150)) * ms,
		delayMin: rng.Int64N(50) * ms,
		drop:     rng.Float64() * 0.3,
		dup:      rng.Float64() * 0.2,
		skew:     skew,
		fifo:     fifo,
		cuts:     rng.IntN(4),
		crashes:  rng.IntN(4),
		check:    true,
	}
	p.delayMax = p.delayMin + rng.Int64N(400)*ms
	win := []int64{sec, 2 * sec, 3 * sec}[rng.IntN(3)]
	nkeys := 1 + rng.IntN(3)
	for k := range nkeys {
		spec := Spec{
			Limit:   []int64{1, 3, 10, 50, 200}[rng.IntN(5)],
			Window:  win,
			Sliding: rng.IntN(2) == 0,
		}
		p.keys = append(p.keys, simKey{name: fmt.Sprintf("k%d", k), spec: spec})
		for range 1 + rng.IntN(3) {
			kind := clientKind(rng.IntN(4))
			rate := spec.Limit * (1 + rng.Int64N(30)) / 10 // 0.1 to 3 limits per window
			hits := int64(1)
			if kind == burster {
				hits = 1 + rng.Int64N(max(spec.Limit/4, 1))
			}
			every := max(spec.Window*hits/max(rate, 1), ms)
			start := rng.Int64N(2 * win)
			p.clients = append(p.clients, simClient{
				key: k, kind: kind, every: every, hits: hits, rep: rng.IntN(p.n),
				moveEvery: win / 2 * (1 + rng.Int64N(4)), start: start, stop: start + (2+rng.Int64N(6))*win,
			})
		}
	}
	p.end = 9 * win
	return p
}

// TestProperty runs hundreds of random scenarios and checks after every
// event that (a) the fractions the replicas hold of any window sum to at
// most Scale, and (b) no window admits more than its limit, nor the sliding
// count pass the limit at any admission instant. Messages carry full
// snapshots (Own) over a network that loses, duplicates and reorders them.
// The skew variant puts every replica's clock up to 5ms off and allows the
// sliding count P·skew/W more, as the package doc states. The streams
// variant sends deltas (Delta) over links that deliver in order, hold
// messages across a cut and replay them to a restarted replica, as the
// driver's contract asks. A failure prints the seed; -seed replays it.
func TestProperty(t *testing.T) {
	seeds := *seedsFlag
	if testing.Short() {
		seeds = 30
	}
	for _, v := range []struct {
		name string
		skew int64
		fifo bool
	}{{"shared clock", 0, false}, {"skew 5ms", 5 * ms, false}, {"streams", 0, true}} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			first, n := uint64(1), uint64(seeds)
			if *seedFlag != 0 {
				first, n = *seedFlag, 1
			}
			var admissions, gives, crashes int
			for seed := first; seed < first+n; seed++ {
				p := randomParams(seed, v.skew, v.fifo)
				p.checkHeld = *heldFlag
				s := newSim(p)
				if err := s.run(); err != nil {
					t.Fatalf("%v\n%s\nreplay: go test -race ./region/escrow -run 'TestProperty/%s' -seed %d",
						err, p, v.name, seed)
				}
				admissions += len(s.log)
				gives += s.gives
				crashes += s.restarts
			}
			t.Logf("%d seeds: %d admissions checked, %d gives made, %d restarts", n, admissions, gives, crashes)
		})
	}
}

// TestRebalanceLooksAtWhatChanged: Rebalance sets keys aside until their
// gives can change (see Rebalance, "Which keys"); over random scenarios,
// with and without streams, its gives — and so every admission after them —
// are the same as when it looks at every key held at every flush.
func TestRebalanceLooksAtWhatChanged(t *testing.T) {
	seeds := uint64(*seedsFlag / 2)
	if testing.Short() {
		seeds = 20
	}
	for _, fifo := range []bool{false, true} {
		for seed := uint64(1); seed <= seeds; seed++ {
			var runs [2]*sim
			for i, sweep := range []bool{false, true} {
				p := randomParams(seed, 0, fifo)
				p.check, p.sweep = false, sweep
				runs[i] = newSim(p)
				if err := runs[i].run(); err != nil {
					t.Fatalf("seed %d fifo %v sweep %v: %v", seed, fifo, sweep, err)
				}
			}
			a, b := runs[0], runs[1]
			if a.gives != b.gives || !slices.Equal(a.log, b.log) {
				t.Fatalf("seed %d fifo %v: %d gives and %d admissions looking at changed keys, %d and %d looking at all",
					seed, fifo, a.gives, len(a.log), b.gives, len(b.log))
			}
		}
	}
}

package escrow

import (
	"fmt"
	"testing"
)

// TestCost measures what bounded costs clients within their limit, on
// streams (deltas, in order, nothing lost) flushing every 100ms over links of
// 50–150ms one way, for 20 windows:
//
//   - a client pinned to one PoP at 0.9 of its limit, on 3 and 10 replicas,
//     windows of 1s (seeds 1–3) and 60s (seed 1): the share of its hits
//     denied — all of them false denials, a central store admits every one —
//     and how many of them fell in its first window;
//   - a client at 0.9 of its limit that moves to a random PoP every 2.5
//     windows (1s windows): the same;
//   - a sprayer at twice the limit over every replica: the share of the
//     limit the replicas together admit (a central store admits all of it).
//
// The figures are logged; the test asserts only the bound (the simulation
// checks every admission against the exact log).
func TestCost(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement; skipped in -short")
	}
	const limit, windows = 1000, 20
	type result struct{ requested, denied, first int64 }
	measure := func(seed uint64, n int, win int64, sliding bool, kind clientKind, rate float64) result {
		spec := Spec{Limit: limit, Window: win, Sliding: sliding}
		c := simClient{kind: kind, hits: 1, stop: windows * win, every: int64(float64(win) / (rate * limit)),
			moveEvery: win * 5 / 2}
		p := simParams{
			seed: seed, n: n, keys: []simKey{{"k", spec}}, clients: []simClient{c},
			end: windows * win, flush: 100 * ms, delayMin: 50 * ms, delayMax: 150 * ms,
			fifo: true, check: true,
		}
		s := newSim(p)
		if err := s.run(); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		cl := s.p.clients[0]
		return result{cl.requested, cl.denied, cl.firstDenied}
	}
	algos := []struct {
		name    string
		sliding bool
	}{{"fixed", false}, {"sliding", true}}
	t.Logf("%-7s %-7s %3s %-7s  %s", "client", "window", "N", "algo", "cost")
	for _, win := range []int64{sec, 60 * sec} {
		seeds := []uint64{1, 2, 3}
		if win > sec {
			seeds = seeds[:1]
		}
		for _, n := range []int{3, 10} {
			for _, a := range algos {
				kinds := []clientKind{pinned, mover}
				if win > sec {
					kinds = kinds[:1]
				}
				for _, kind := range kinds {
					var cells []string
					for _, seed := range seeds {
						r := measure(seed, n, win, a.sliding, kind, 0.9)
						cells = append(cells, fmt.Sprintf("%.2f%% denied (%d in the first window)",
							100*float64(r.denied)/float64(r.requested), r.first))
					}
					t.Logf("%-7s %-7s %3d %-7s  %v", kind, fmt.Sprint(win/sec, "s"), n, a.name, cells)
				}
				r := measure(1, n, win, a.sliding, sprayer, 2)
				t.Logf("%-7s %-7s %3d %-7s  %.1f%% of the limit admitted", "sprayer", fmt.Sprint(win/sec, "s"), n, a.name,
					100*float64(r.requested-r.denied)/float64(windows*limit))
			}
		}
	}
}

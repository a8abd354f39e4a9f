package simulate

import (
	"math"
	"testing"
)

// The eventual bound is the hits the worst-placed deciding PoP cannot have
// heard of, Σ rate × (flush + slowest delay with jitter) over the other
// PoPs a key's traffic reaches, never more than (m−1) limits, and 0 for a
// key decided at one PoP alone.
func TestEventualBound(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sources string
		want    float64
	}{
		// 1000/s sprayed over 2 PoPs: the other's 500/s × (50ms + 40ms + 5ms).
		{"spray", `[{name: s, rate: 1000, spread: spray}]`, 4.75},
		{"one PoP", `[{name: a, rate: 5000, spread: anycast, pop: p1}]`, 0},
		// Two anycast clients of one key at two PoPs, one ramping to 3000/s:
		// p1 misses up to 3000/s × 95ms of p2's.
		{"two PoPs, ramp", `[{name: a, rate: 1000, spread: anycast, pop: p1},
  {name: b, rate: 100, rate_end: 3000, spread: anycast, pop: p2, end: 1s}]`, 28.5},
		// 100,000/s over 2 PoPs would be 4750: the other can admit at most a limit.
		{"capped", `[{name: s, rate: 100000, spread: random}]`, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := ParseScenario([]byte(`name: b
duration: 1s
flush_interval: 50ms
regions:
  - {name: r1, pops: [p1]}
  - {name: r2, pops: [p2]}
latency:
  - {from: r1, to: r2, ms: 40, jitter_ms: 5}
limit: {requests_per_unit: 1000, unit: second}
sources: ` + tc.sources + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			top := newTopology(&sc)
			srcs, keys := population(&sc, top, 1000)
			if got := eventualBound(&sc, top, srcs, len(keys), 1000); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("bound %.4f%%, want %.4f%%", got, tc.want)
			}
		})
	}
}

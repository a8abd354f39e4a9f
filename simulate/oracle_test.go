package simulate

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"unsafe"
)

// TestOracle grades timelines computed by hand: window 10ns, limit 3.
func TestOracle(t *testing.T) {
	type dec struct {
		at    int64
		admit bool
	}
	cases := []struct {
		name                     string
		decs                     []dec
		falseAllow, falseDeny    int64
		worst, admitted          int64
		crossing, firstDeny, end int64
		windows                  int64 // fixed windows that admitted anything
		excess                   int64 // Σ per fixed window of max(0, admitted − limit)
		legit                    int64
	}{
		{
			// The denial at 3 is the 4th hit offered in (−7, 3]: not legit.
			name:      "exact limiter",
			decs:      []dec{{0, true}, {1, true}, {2, true}, {3, false}, {10, true}, {11, true}},
			admitted:  5,
			crossing:  3,
			firstDeny: 3,
			end:       20, windows: 2,
		},
		{
			// t=10 sees (0, 10]: the hits at 1 and 2 (0 left), so 2 + 1 ≤ 3 fits.
			name:      "window boundary is exclusive",
			decs:      []dec{{0, true}, {1, true}, {2, true}, {10, true}, {10, false}},
			admitted:  4,
			falseDeny: 0, // at the second t=10: 3 in (0,10], one more does not fit
			crossing:  10, firstDeny: 10,
			end: 20, windows: 2, excess: 0,
		},
		{
			name:       "overshoot and false allows",
			decs:       []dec{{0, true}, {1, true}, {2, true}, {3, true}, {4, true}, {5, false}},
			admitted:   5,
			falseAllow: 2, worst: 2,
			crossing: 3, firstDeny: 5,
			end: 10, windows: 1, excess: 2,
		},
		{
			// Offered in (−10, 1] are 2 hits, in (2, 12] 1: both denials
			// wronged a client within its limit.
			name:      "false denies",
			decs:      []dec{{0, true}, {1, false}, {2, true}, {12, false}},
			admitted:  2,
			falseDeny: 2, legit: 2,
			crossing: -1, firstDeny: 1,
			end: 25, windows: 1,
		},
		{
			// Hits at 8, 9 (window 0) and 10, 11 (window 1): 4 in (1, 11] is
			// over, though no fixed window holds more than 2.
			name:       "sliding overshoot across fixed windows",
			decs:       []dec{{8, true}, {9, true}, {10, true}, {11, true}},
			admitted:   4,
			falseAllow: 1, worst: 1,
			crossing: 11, firstDeny: -1,
			end: 20, windows: 2,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := newOracle(10, 3, 1, 0, 1, c.end)
			for _, d := range c.decs {
				o.decide(0, d.at, 1, d.admit)
			}
			o.finish()
			k := o.firsts[0]
			got := []int64{o.falseAllow, o.falseDeny, o.legitDeny, o.worst, o.admitted, k.crossing, k.firstDeny, o.fixedWindows, o.fixedExcess}
			want := []int64{c.falseAllow, c.falseDeny, c.legit, c.worst, c.admitted, c.crossing, c.firstDeny, c.windows, c.excess}
			names := []string{"false allows", "false denies", "legit denies", "worst", "admitted", "crossing", "first deny", "windows", "excess"}
			for i := range got {
				if got[i] != want[i] {
					t.Errorf("%s = %d, want %d", names[i], got[i], want[i])
				}
			}
		})
	}
}

// TestOracleCompacts checks that a long run keeps the log short and the
// count exact.
func TestOracleCompacts(t *testing.T) {
	o := newOracle(100, 50, 1, 0, 1000, 100000)
	for i := range int64(100000) {
		o.decide(0, i, 1, true)
	}
	k := &o.keys[0]
	if k.adm != 100 || k.offered != 100 {
		t.Fatalf("count in the last window = %d admitted, %d offered; want 100", k.adm, k.offered)
	}
	if o.worst != 50 {
		t.Fatalf("worst = %d, want 50", o.worst)
	}
	if live := len(k.sp) - int(k.spHead) + int(k.n); live != 100 {
		t.Fatalf("the log holds %d live entries, want 100", live)
	}
	if cap(k.sp) > 512 {
		t.Fatalf("the spill has capacity %d for a window of 100", cap(k.sp))
	}
}

// TestOracleKeys checks that keys are graded apart, and the per-key figures:
// the histogram of excess per fixed window, the tracked key's series, and
// the denial lags. Window 10, limit 4.
func TestOracleKeys(t *testing.T) {
	o := newOracle(10, 4, 3, 1, 5, 20)
	// Key 0: 4 hits at 0..3 fit; 2 more at 4, 5 are false allows (excess 2 =
	// 50% of the limit); denied at 6 (crossed at 4: lag 2).
	for at := int64(0); at < 6; at++ {
		o.decide(0, at, 1, true)
	}
	o.decide(0, 6, 1, false)
	// Key 1 (tracked): 3 hits in window 0, denied at 7 though it fits (a
	// legit deny: 4 offered); 1 hit in window 1 at 12.
	for at := int64(1); at < 4; at++ {
		o.decide(1, at, 1, true)
	}
	o.decide(1, 7, 1, false)
	o.decide(1, 12, 1, true)
	// Key 2: never decided.
	o.finish()

	if o.falseAllow != 2 || o.falseDeny != 1 || o.legitDeny != 1 {
		t.Errorf("false allows %d, denies %d, legit %d; want 2, 1, 1", o.falseAllow, o.falseDeny, o.legitDeny)
	}
	if o.worst != 2 {
		t.Errorf("worst = %d, want 2 (key 0 only)", o.worst)
	}
	// Windows that admitted: key 0 window 0 (excess 50%), key 1 windows 0
	// and 1 (none).
	want := make([]int64, len(OvershootBuckets)+1)
	want[0] = 2
	want[slices.Index(OvershootBuckets, 50)] = 1
	if !slices.Equal(o.hist, want) {
		t.Errorf("histogram %v, want %v (edges %v)", o.hist, want, OvershootBuckets)
	}
	// Series of key 1 in steps of 5: [0,5) peaks at 3 admitted, [5,10)
	// saw 3 at the denial, [10,15) 2 (hits at 2, 3 expired by 12: (2,12]
	// holds 3 and 12 → 2).
	if want := []int64{3, 3, 2, 0}; !slices.Equal(o.series, want) {
		t.Errorf("series %v, want %v", o.series, want)
	}
	if !slices.Equal(o.lags, []int64{2}) {
		t.Errorf("lags %v, want [2] (key 0 crossed at 4, denied at 6; key 1 never crossed)", o.lags)
	}
	if o.keys[2].fixedCount != 0 || o.firsts[2].crossing != -1 {
		t.Error("key 2 was touched")
	}
}

func TestQuantiles(t *testing.T) {
	if q := quantiles(nil); q != (Quantiles{}) {
		t.Errorf("no samples: %+v", q)
	}
	s := make([]int64, 100)
	for i := range s {
		s[i] = int64(100 - i) // 100..1, unsorted
	}
	q := quantiles(s)
	if q.N != 100 || q.P50 != 50 || q.P99 != 99 || q.Max != 100 {
		t.Errorf("quantiles of 1..100 = %+v", q)
	}
}

// TestKeyLogSize: a key's log is two cache lines, the second exactly its
// inline ring, so that a 128-byte-aligned keyLog never straddles a third line
// (see keyLog).
func TestKeyLogSize(t *testing.T) {
	if n := unsafe.Sizeof(keyLog{}); n != 128 {
		t.Fatalf("keyLog is %d bytes, want 128", n)
	}
	if off := unsafe.Offsetof(keyLog{}.in); off != 64 {
		t.Fatalf("the inline ring starts at byte %d, want 64", off)
	}
}

// modelOracle grades decisions by brute force, the way oracle documents it:
// every decision kept, A and O counted by scanning.
type modelOracle struct {
	window, limit int64
	decs          [][]modelDec // per key

	falseAllow, falseDeny, legitDeny, worst, admitted int64
	crossing, firstDeny                               []int64
	lags                                              []int64
	series                                            []int64
	tracked                                           int
	seriesStep                                        int64
}

type modelDec struct {
	at, n int64
	admit bool
}

func (m *modelOracle) decide(ki int, now, hits int64, admitted bool) {
	var a, off int64 // admitted and offered in (now − window, now], before this one
	for _, d := range m.decs[ki] {
		if d.at > now-m.window {
			off += d.n
			if d.admit {
				a += d.n
			}
		}
	}
	m.decs[ki] = append(m.decs[ki], modelDec{now, hits, admitted})
	fits := a+hits <= m.limit
	if !fits && m.crossing[ki] < 0 {
		m.crossing[ki] = now
		if m.firstDeny[ki] >= 0 {
			m.lags = append(m.lags, m.firstDeny[ki]-now)
		}
	}
	if admitted {
		a += hits
		m.admitted += hits
		if !fits {
			m.falseAllow++
		}
		m.worst = max(m.worst, a-m.limit)
	} else {
		if fits {
			m.falseDeny++
		}
		if off+hits <= m.limit {
			m.legitDeny++
		}
		if m.firstDeny[ki] < 0 {
			m.firstDeny[ki] = now
			if m.crossing[ki] >= 0 {
				m.lags = append(m.lags, now-m.crossing[ki])
			}
		}
	}
	if ki == m.tracked {
		if i := now / m.seriesStep; i < int64(len(m.series)) {
			m.series[i] = max(m.series[i], a)
		}
	}
}

// fixed returns Σ max(0, admitted − limit) over the (key, fixed window)
// pairs that admitted anything, their count, and their histogram.
func (m *modelOracle) fixed() (excess, windows int64, hist []int64) {
	hist = make([]int64, len(OvershootBuckets)+1)
	for _, decs := range m.decs {
		counts := map[int64]int64{}
		for _, d := range decs {
			if d.admit {
				counts[d.at/m.window] += d.n
			}
		}
		for _, c := range counts {
			if c == 0 {
				continue
			}
			x := max(c-m.limit, 0)
			excess += x
			windows++
			pct := 100 * float64(x) / float64(m.limit)
			b := len(OvershootBuckets)
			for i, edge := range OvershootBuckets {
				if pct <= edge {
					b = i
					break
				}
			}
			hist[b]++
		}
	}
	return excess, windows, hist
}

// TestOracleModel replays random timelines against modelOracle. Each key
// alternates bursts (many hits close together, well past the inline ring and
// often past the limit), quiet spells (a hit now and then, few enough to fit
// inline) and silences longer than the window, so its log goes inline →
// spill → inline and back again. Window 1000 ns, limit 12 (more than the ring
// holds, so a spilled key is often within its limit).
func TestOracleModel(t *testing.T) {
	const window, limit, keys, duration = 1000, 12, 4, 200_000
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		o := newOracle(window, limit, keys, 1, 500, duration)
		m := &modelOracle{window: window, limit: limit, decs: make([][]modelDec, keys),
			crossing: make([]int64, keys), firstDeny: make([]int64, keys),
			series: make([]int64, duration/500), tracked: 1, seriesStep: 500}
		for i := range keys {
			m.crossing[i], m.firstDeny[i] = -1, -1
		}
		// Each key's own timeline, in phases of 1–60 decisions: 0 a burst,
		// 1 quiet, 2 silent; then all keys' merged in time order.
		type dec struct {
			ki       int
			at, hits int64
			admit    bool
		}
		var decs []dec
		for ki := range keys {
			now := int64(rng.IntN(window))
			for now < duration {
				phase := rng.IntN(3)
				for range 1 + rng.IntN(60) {
					switch phase {
					case 0:
						now += int64(rng.IntN(4)) // ties included
					case 1:
						now += int64(rng.IntN(300))
					default:
						now += window + int64(rng.IntN(2*window))
					}
					hits := int64(1)
					if rng.IntN(20) == 0 {
						hits = int64(rng.IntN(3)) // 0 and 2 too: the log keeps one entry a hit
					}
					decs = append(decs, dec{ki, now, hits, rng.IntN(4) != 0})
				}
			}
		}
		slices.SortStableFunc(decs, func(a, b dec) int { return cmp.Compare(a.at, b.at) })
		spilled, unspilled, respilled := 0, 0, 0
		wasSpilled := make([]bool, keys)
		backInline := make([]bool, keys)
		for _, d := range decs {
			ki, now := d.ki, d.at
			o.decide(ki, now, d.hits, d.admit)
			m.decide(ki, now, d.hits, d.admit)

			k := &o.keys[ki]
			if int64(k.adm) != m.countAdmitted(ki, now) {
				t.Fatalf("seed %d: key %d at %d: %d admitted in the log, model %d", seed, ki, now, k.adm, m.countAdmitted(ki, now))
			}
			inSpill := len(k.sp) > int(k.spHead)
			switch {
			case inSpill && !wasSpilled[ki]:
				spilled++
				if backInline[ki] {
					respilled++
				}
				wasSpilled[ki] = true
			case !inSpill && wasSpilled[ki]:
				unspilled++
				wasSpilled[ki], backInline[ki] = false, true
			}
		}
		o.finish()
		excess, windows, hist := m.fixed()
		got := []int64{o.falseAllow, o.falseDeny, o.legitDeny, o.worst, o.admitted, o.fixedExcess, o.fixedWindows}
		want := []int64{m.falseAllow, m.falseDeny, m.legitDeny, m.worst, m.admitted, excess, windows}
		if !slices.Equal(got, want) {
			t.Errorf("seed %d: false allow, false deny, legit deny, worst, admitted, fixed excess, fixed windows = %v, model %v", seed, got, want)
		}
		if !slices.Equal(o.hist, hist) {
			t.Errorf("seed %d: histogram %v, model %v", seed, o.hist, hist)
		}
		if !slices.Equal(o.series, m.series) {
			t.Errorf("seed %d: series %v, model %v", seed, o.series, m.series)
		}
		if !slices.Equal(o.lags, m.lags) {
			t.Errorf("seed %d: lags %v, model %v", seed, o.lags, m.lags)
		}
		for i := range keys {
			if f := o.firsts[i]; f.crossing != m.crossing[i] || f.firstDeny != m.firstDeny[i] {
				t.Errorf("seed %d key %d: crossing, first deny = %d, %d; model %d, %d", seed, i, f.crossing, f.firstDeny, m.crossing[i], m.firstDeny[i])
			}
		}
		if spilled == 0 || unspilled == 0 || respilled == 0 {
			t.Errorf("seed %d: %d spills, %d returns inline, %d spills after a return: the timeline misses a transition", seed, spilled, unspilled, respilled)
		}
		if seed == 0 {
			t.Logf("seed 0: %d decisions, %d spills, %d returns inline, %d spills after a return", o.decisions, spilled, unspilled, respilled)
		}
	}
}

// countAdmitted is the model's admitted hits of key ki in (now − window, now].
func (m *modelOracle) countAdmitted(ki int, now int64) int64 {
	var a int64
	for _, d := range m.decs[ki] {
		if d.admit && d.at > now-m.window {
			a += d.n
		}
	}
	return a
}

// BenchmarkOracleDecide: decisions over 270,000 keys in random order, rates
// Pareto (alpha 1.5, mean 0.1/s) with 0.5% of keys abusive (2–50 × a limit of
// 100 a minute; a quarter of them, 0.125% of keys, at a time), window 60 s:
// roughly the mix scenario's load on the oracle alone.
func BenchmarkOracleDecide(b *testing.B) {
	const keys, window, limit = 270_000, int64(60e9), 100
	rng := rand.New(rand.NewPCG(1, 2))
	cum := make([]float64, keys)
	var total float64
	for i := range cum {
		r := 0.1 / 3 * math.Pow(1-rng.Float64(), -1/1.5) // Pareto, xm = mean·(α−1)/α
		if rng.IntN(800) == 0 {                          // a quarter of them active at a time
			r = (2 + 48*rng.Float64()) * limit / 60
		}
		total += r
		cum[i] = total
	}
	const n = 1 << 22
	seq := make([]int32, n)
	for i := range seq {
		seq[i] = int32(min(sort.SearchFloat64s(cum, rng.Float64()*total), keys-1))
	}
	dt := int64(1e9 / total) // the keys' total rate
	o := newOracle(window, limit, keys, 0, 1e9, int64(b.N+1)*dt)
	now, spilled := int64(0), 0
	b.ResetTimer()
	for i := range b.N {
		ki := int(seq[i&(n-1)])
		k := &o.keys[ki]
		o.decide(ki, now, 1, int64(k.adm) < limit)
		if len(k.sp) > int(k.spHead) {
			spilled++
		}
		now += dt
	}
	b.ReportMetric(float64(spilled)/float64(b.N), "spilled/op")
}

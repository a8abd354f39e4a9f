package simulate

import (
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// trafficSources is a small population with every kind of source: steady
// ones merged into one stream, one with on/off phases, a late starter, and
// every spread.
func trafficSources() []source {
	d := int64(20 * time.Second)
	return []source{
		{rate: 300, spread: Anycast, pop: 2, end: d, key: 0},
		{rate: 200, spread: Spray, end: d, key: 1},
		{rate: 100, spread: Random, end: d, key: 2},
		{rate: 500, spread: Random, start: int64(time.Second), end: d, on: int64(time.Second), off: int64(2 * time.Second), key: 3},
		{rate: 50, spread: Spray, start: int64(5 * time.Second), end: int64(15 * time.Second), key: 4},
	}
}

// readAll reads every arrival of r, yielding to the scheduler now and then
// when slow is set, so that readers move at different speeds.
func readAll(r *reader, slow bool) []arrival {
	var out []arrival
	for {
		a, ok := r.peek()
		if !ok {
			return out
		}
		out = append(out, *a)
		r.take()
		if slow && len(out)%1000 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
}

// TestTrafficShared: readers of one traffic, fast and slow, read the very
// same arrivals, in time order, with every source's own properties (its PoP
// when anycast, a round robin when spraying, its phases), and the traffic
// never holds more than aheadChunks+1 chunks.
func TestTrafficShared(t *testing.T) {
	srcs := trafficSources()
	const pops = 4
	d := int64(20 * time.Second)
	tr := newTraffic(7, srcs, pops, d, 3)
	tr.size = 128 // many chunks, to make readers wait
	got := make([][]arrival, 3)
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &reader{t: tr, id: i}
			defer r.close()
			got[i] = readAll(r, i == 2)
		}()
	}
	wg.Wait()
	for i := 1; i < len(got); i++ {
		if !slices.Equal(got[0], got[i]) {
			t.Fatalf("reader %d read %d arrivals, reader 0 %d, or different ones", i, len(got[i]), len(got[0]))
		}
	}
	if tr.base < 100 {
		t.Errorf("dropped %d chunks; readers read them all", tr.base)
	}
	if tr.peak > aheadChunks+1 {
		t.Errorf("traffic held %d chunks, want at most %d", tr.peak, aheadChunks+1)
	}
	// A lone reader of a fresh traffic with the same seed reads the same.
	if again := readAll(&reader{t: newTraffic(7, srcs, pops, d, 1)}, false); !slices.Equal(again, got[0]) {
		t.Fatal("the same seed drew other arrivals")
	}
	arr := got[0]
	// Expected counts: 300·20 + 200·20 + 100·20 + 500·(7 s on in [1 s, 20 s)) + 50·10.
	if want := 6000 + 4000 + 2000 + 500*7 + 500; abs(len(arr)-want) > 5*isqrt(want) {
		t.Errorf("%d arrivals, want about %d", len(arr), want)
	}
	next := make([]int, len(srcs)) // next PoP of each spraying key
	for i := range next {
		next[i] = -1
	}
	for i, a := range arr {
		if i > 0 && a.at < arr[i-1].at {
			t.Fatalf("arrival %d at %d before the previous at %d", i, a.at, arr[i-1].at)
		}
		s := srcs[a.key]
		if a.at < s.start || a.at >= s.end || a.at >= d {
			t.Fatalf("key %d arrived at %v, outside [%v, %v)", a.key, time.Duration(a.at), time.Duration(s.start), time.Duration(s.end))
		}
		if s.on > 0 && (a.at-s.start)%(s.on+s.off) >= s.on {
			t.Fatalf("key %d arrived at %v, in an off phase", a.key, time.Duration(a.at))
		}
		switch s.spread {
		case Anycast:
			if int(a.pop) != s.pop {
				t.Fatalf("anycast key %d at PoP %d, want %d", a.key, a.pop, s.pop)
			}
		case Spray:
			if next[a.key] >= 0 && int(a.pop) != next[a.key] {
				t.Fatalf("spraying key %d at PoP %d, want %d", a.key, a.pop, next[a.key])
			}
			next[a.key] = (int(a.pop) + 1) % pops
		}
		if a.pop < 0 || a.pop >= pops {
			t.Fatalf("PoP %d out of range", a.pop)
		}
	}
}

// TestTrafficReaderLeaves: a reader that stops early (its run failed) must
// not hold the others back.
func TestTrafficReaderLeaves(t *testing.T) {
	tr := newTraffic(1, trafficSources(), 4, int64(20*time.Second), 2)
	tr.size = 64
	quitter := &reader{t: tr, id: 1}
	if _, ok := quitter.peek(); !ok {
		t.Fatal("no arrivals")
	}
	quitter.close()
	done := make(chan int)
	go func() { done <- len(readAll(&reader{t: tr, id: 0}, false)) }()
	select {
	case n := <-done:
		if n < 100*tr.size {
			t.Fatalf("read %d arrivals, want them all", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the remaining reader waits for one that left")
	}
}

func abs(x int) int { return max(x, -x) }

func isqrt(x int) int {
	r := 0
	for (r+1)*(r+1) <= x {
		r++
	}
	return r
}

// TestKeyNames: a mix key's formatted name is the name population gives it.
func TestKeyNames(t *testing.T) {
	n := keyNames{named: []string{"alice", "bob"}}
	for k, want := range map[int]string{0: "alice", 1: "bob", 2: mixKey(0), 3: mixKey(1), 123458: mixKey(123456)} {
		if got := n.name(k); got != want {
			t.Errorf("name(%d) = %q, want %q", k, got, want)
		}
	}
}

// TestTrafficRamp: a source with rate_end sends a Poisson process whose rate
// ramps linearly from rate at start to rate_end at end: the arrivals in each
// second follow the ramp (up, down, and within on phases), none fall outside
// the source's span, and the report offers the ramp's mean rate.
func TestTrafficRamp(t *testing.T) {
	s := int64(time.Second)
	srcs := []source{
		{rate: 100, rateEnd: 500, spread: Spray, start: 2 * s, end: 22 * s, key: 0},
		{rate: 400, rateEnd: 50, spread: Anycast, pop: 1, end: 20 * s, key: 1},
		{rate: 200, rateEnd: 600, spread: Random, start: 4 * s, end: 24 * s, on: s, off: s, key: 2},
	}
	const pops = 4
	d := 25 * s
	arr := readAll(&reader{t: newTraffic(3, srcs, pops, d, 1)}, false)
	counts := make([][]int, len(srcs)) // per key and second
	for k := range counts {
		counts[k] = make([]int, d/s)
	}
	for _, a := range arr {
		src := srcs[a.key]
		if a.at < src.start || a.at >= src.end {
			t.Fatalf("key %d arrived at %v, outside [%v, %v)", a.key, time.Duration(a.at), time.Duration(src.start), time.Duration(src.end))
		}
		counts[a.key][a.at/s]++
	}
	for k, src := range srcs {
		total, want := 0, 0.0
		for sec, n := range counts[k] {
			t0, t1 := int64(sec)*s, int64(sec+1)*s
			var mean float64 // the rate's integral over the second
			if t0 >= src.start && t1 <= src.end && (src.on == 0 || (t0-src.start)%(src.on+src.off) < src.on) {
				mid := float64(t0+s/2-src.start) / float64(src.end-src.start)
				mean = src.rate + (src.rateEnd-src.rate)*mid
			}
			if math.Abs(float64(n)-mean) > 5*math.Sqrt(mean)+0.5 {
				t.Errorf("key %d second %d: %d arrivals, want about %.0f (the ramp from %v to %v)", k, sec, n, mean, src.rate, src.rateEnd)
			}
			total += n
			want += mean
		}
		if off := float64(total) - want; math.Abs(off) > 5*math.Sqrt(want) {
			t.Errorf("key %d: %d arrivals in all, want about %.0f", k, total, want)
		}
		if got, exp := srcs[k].offered(), want; k < 2 && math.Abs(got-exp) > 1e-6*exp {
			t.Errorf("key %d offers %.1f requests, want the ramp's %.1f", k, got, exp)
		}
	}
	// A ramp's slope shows: its first five seconds (mean rate 150/s) against
	// its last five (450/s).
	first, last := 0, 0
	for sec := 2; sec < 7; sec++ {
		first += counts[0][sec]
		last += counts[0][sec+15]
	}
	if !(float64(last) > 2.5*float64(first)) {
		t.Errorf("ramp 100→500/s: %d arrivals in its first 5 s, %d in its last 5 s; want about 750 and 2250", first, last)
	}
	// A source whose rate_end equals its rate is a plain Poisson source: the
	// very same arrivals.
	plain := []source{{rate: 300, spread: Anycast, start: s, end: 9 * s}}
	flat := []source{{rate: 300, rateEnd: 300, spread: Anycast, start: s, end: 9 * s}}
	if a, b := readAll(&reader{t: newTraffic(5, plain, pops, d, 1)}, false), readAll(&reader{t: newTraffic(5, flat, pops, d, 1)}, false); !slices.Equal(a, b) {
		t.Error("rate_end equal to rate drew other arrivals than no rate_end")
	}
}

// TestScenarioRateEnd: rate_end loads into the source and must not be
// negative.
func TestScenarioRateEnd(t *testing.T) {
	const sc = `
duration: 10s
regions: [{name: us, pops: [a, b]}]
limit: {requests_per_unit: 100, unit: second}
sources: [{rate: 50, rate_end: %s, spread: spray}]
`
	got, err := ParseScenario([]byte(strings.Replace(sc, "%s", "150", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got.Sources[0].RateEnd != 150 {
		t.Fatalf("rate_end %v, want 150", got.Sources[0].RateEnd)
	}
	if _, err := ParseScenario([]byte(strings.Replace(sc, "%s", "-1", 1))); err == nil || !strings.Contains(err.Error(), "sources[0].rate_end: must be positive") {
		t.Fatalf("rate_end -1: got %v, want an error", err)
	}
}

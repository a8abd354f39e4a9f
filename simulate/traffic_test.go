package simulate

import (
	"slices"
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

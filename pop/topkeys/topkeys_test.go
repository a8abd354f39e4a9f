package topkeys

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestHeavyHittersSurviveAFlood: three heavy keys among 100,000 keys seen
// once each, in random order, with 64 counters: the heavy keys rank first,
// each count is within its error of the truth, and every error is at most
// N/k, as Space-Saving guarantees.
func TestHeavyHittersSurviveAFlood(t *testing.T) {
	s := New(64)
	heavy := map[string]uint64{"heavy-a": 30000, "heavy-b": 20000, "heavy-c": 10000}
	var stream []string
	for k, n := range heavy {
		for range n {
			stream = append(stream, k)
		}
	}
	for i := range 100000 {
		stream = append(stream, fmt.Sprintf("flood-%d", i))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	for _, k := range stream {
		s.Add([]byte(k), 1)
	}
	top := s.Top(3)
	bound := uint64(len(stream)) / 64
	for i, want := range []string{"heavy-a", "heavy-b", "heavy-c"} {
		e := top[i]
		if e.Key != want {
			t.Fatalf("rank %d: %q, want %q (top %v)", i+1, e.Key, want, top)
		}
		if e.Count < heavy[want] || e.Count-e.Err > heavy[want] || e.Err > bound {
			t.Errorf("%s: count %d err %d, true %d, bound N/k %d", want, e.Count, e.Err, heavy[want], bound)
		}
	}
	if len(s.Top(-1)) != 64 || s.Total() != uint64(len(stream)) {
		t.Errorf("sketch holds %d keys (want 64), total %d (want %d)", len(s.Top(-1)), s.Total(), len(stream))
	}
}

// TestExactWhileItFits: with no more keys than counters, counts are exact
// and errors zero.
func TestExactWhileItFits(t *testing.T) {
	s := New(4)
	for i, k := range []string{"a", "b", "c", "a", "a", "b"} {
		s.Add([]byte(k), uint64(i%2+1))
	}
	got := fmt.Sprint(s.Top(10))
	if want := "[{a 4 0} {b 4 0} {c 1 0}]"; got != want {
		t.Errorf("Top = %s, want %s", got, want)
	}
}

// TestConcurrentAdds counts from many goroutines: the total is exact (run
// with -race).
func TestConcurrentAdds(t *testing.T) {
	s := New(8)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				s.Add([]byte(fmt.Sprintf("k%d", (g*i)%20)), 1)
			}
		})
	}
	wg.Wait()
	if s.Total() != 8000 {
		t.Errorf("total %d, want 8000", s.Total())
	}
}

// TestCollector: the metric carries at most n series, ranked, with the key
// described.
func TestCollector(t *testing.T) {
	s := New(16)
	for i := range 10 {
		for range i + 1 {
			s.Add([]byte(fmt.Sprintf("k%d", i)), 1)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collector(3, strings.ToUpper))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "edgelimit_top_limited_keys" {
		t.Fatalf("gathered %v", mfs)
	}
	var got []string
	for _, m := range mfs[0].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		got = append(got, fmt.Sprintf("%s=%s:%v", l["rank"], l["key"], m.GetGauge().GetValue()))
	}
	sort.Strings(got) // Gather orders series by label values
	if want := "[1=K9:10 2=K8:9 3=K7:8]"; fmt.Sprint(got) != want {
		t.Errorf("series %v, want %s", got, want)
	}
}

// BenchmarkAdd is the cost a denial pays: a key already in the sketch (the
// usual case under abuse: the same keys again and again), and a flood of
// new keys, each replacing the least counted.
func BenchmarkAdd(b *testing.B) {
	for _, k := range []int{64, 1024} {
		keys := make([][]byte, 4096)
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "edge\x00api_key\x00client-%d", i)
		}
		b.Run(fmt.Sprintf("k=%d/hot", k), func(b *testing.B) {
			s := New(k)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					s.Add(keys[i%16], 1)
					i++
				}
			})
		})
		b.Run(fmt.Sprintf("k=%d/flood", k), func(b *testing.B) {
			s := New(k)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				s.Add(keys[i%len(keys)], 1)
			}
		})
	}
}

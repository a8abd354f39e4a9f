package escrow

import (
	"fmt"
	"strconv"
	"testing"
)

// BenchmarkDecide is the hot path in its steady state: one key, decisions
// within one window, every other replica heard since the boundary (so the
// sliding window's P̂ loops over all of them).
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{3, 10, 50} {
		for _, sliding := range []bool{false, true} {
			name := fmt.Sprintf("n=%d/fixed", n)
			if sliding {
				name = fmt.Sprintf("n=%d/sliding", n)
			}
			b.Run(name, func(b *testing.B) {
				names := make([]string, n)
				for i := range names {
					names[i] = "pop" + strconv.Itoa(i)
				}
				l, err := New(Config{Self: names[0], Replicas: names, Incarnation: -7200 * sec})
				if err != nil {
					b.Fatal(err)
				}
				spec := Spec{Limit: MaxLimit, Window: 3600 * sec, Sliding: sliding}
				for _, r := range names[1:] {
					l.Heard(News{From: r, Incarnation: -7200 * sec, SentAt: 0})
				}
				l.Decide(0, "k", spec, 1)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if ok, _ := l.Decide(int64(i), "k", spec, 1); !ok {
						b.Fatal("denied")
					}
				}
			})
		}
	}
}

// BenchmarkRebalance is one flush's Rebalance of a ledger that holds many
// keys, each demanded at one other replica (a crowd of small clients, each
// pinned to a PoP), with nothing heard since the last flush: the steady
// state of a PoP beside a busy one, where no give is due.
func BenchmarkRebalance(b *testing.B) {
	for _, keys := range []int{100, 5000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			const n = 10
			names := make([]string, n)
			for i := range names {
				names[i] = "pop" + strconv.Itoa(i)
			}
			l, err := New(Config{Self: names[0], Replicas: names, Incarnation: -7200 * sec})
			if err != nil {
				b.Fatal(err)
			}
			spec := Spec{Limit: 600, Window: 60 * sec, Sliding: true}
			var items []Item
			for i := range keys {
				items = append(items, Item{Kind: Requested, Key: "k" + strconv.Itoa(i), Window: 0, Spec: spec,
					Replica: names[1+i%(n-1)], Value: 5})
			}
			for _, r := range names[1:] {
				if err := l.Apply(News{From: r, Incarnation: -7200 * sec, SentAt: 0}, items); err != nil {
					b.Fatal(err)
				}
			}
			now := int64(sec)
			l.Rebalance(now)
			l.Delta(now)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				now += sec / 1000 // within the window
				l.Rebalance(now)
			}
		})
	}
}

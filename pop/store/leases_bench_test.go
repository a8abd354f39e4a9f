package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// BenchmarkLeasesAcquireRelease is one lease's life in the embedded store:
// an acquisition and its release, on one hot key and spread over 4096 keys,
// in parallel. Compare with BenchmarkMemoryCheck, a rate limit's check.
func BenchmarkLeasesAcquireRelease(b *testing.B) {
	for _, keys := range []int{1, 4096} {
		b.Run(fmt.Sprint("keys=", keys), func(b *testing.B) {
			s := NewLeases()
			sk := make([]limit.SlotKey, keys)
			for i := range sk {
				sk[i] = limit.SlotKeyOf(fmt.Appendf(nil, "bench:%d", i))
			}
			var workers atomic.Uint32
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				w := workers.Add(1)
				items := []limit.SlotItem{{Max: 1 << 30, TTL: int64(time.Minute)}}
				out := make([]limit.SlotDecision, 1)
				keys := make([]limit.SlotKey, 1)
				var id limit.LeaseID
				i := 0
				for pb.Next() {
					id[0], id[1], id[2], id[15] = byte(i), byte(i>>8), byte(i>>16), byte(w)
					items[0].Key = sk[i%len(sk)]
					now := t0 + int64(i)
					if ok, _ := s.AcquireAt(context.Background(), now, id, items, out); !ok {
						b.Fatal("denied")
					}
					keys[0] = items[0].Key
					if st, _ := s.ReleaseAt(context.Background(), now, limit.Lease{ID: id, Keys: keys}); st != limit.Released {
						b.Fatal(st)
					}
					i++
				}
			})
		})
	}
}

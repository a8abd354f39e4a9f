package quota_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/quota"
)

// TestLoadMillion measures what a PoP pays to hold a million quotas: the
// time to load them from PostgreSQL and from its snapshot file, and the heap
// they take. It writes a million rows, so it runs only with
// EDGELIMIT_QUOTA_1M=1 (see docs/tenants.md for the figures).
func TestLoadMillion(t *testing.T) {
	if os.Getenv("EDGELIMIT_QUOTA_1M") != "1" {
		t.Skip("set EDGELIMIT_QUOTA_1M=1 to load a million quotas")
	}
	n := 1_000_000
	if s := os.Getenv("EDGELIMIT_QUOTA_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	ctx := context.Background()
	p, conn := openWithConn(t)
	// Half the keys have a tier only, half an override too: 1.5 rows a key.
	start := time.Now()
	if _, err := conn.Exec(ctx, `INSERT INTO quota_overrides (api_key, descriptor, tier)
		SELECT 'key-' || i, '', CASE WHEN i % 3 = 0 THEN 'enterprise' ELSE 'pro' END FROM generate_series(1, $1) i`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO quota_overrides (api_key, descriptor, tier, requests_per_unit, unit)
		SELECT 'key-' || i, 'tier:pro', 'pro', 1000 + i % 100, 'minute' FROM generate_series(1, $1, 2) i`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO quota_audit (api_key, actor) VALUES ('*', 'bulk load')`); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d quotas in %v", n, time.Since(start).Round(time.Millisecond))

	heap := func() uint64 {
		runtime.GC()
		runtime.GC() // the second empties sync.Pool victims (encoders' buffers)
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	// peak samples the heap's live and not yet collected objects every
	// millisecond until stop is called, which returns the highest sample.
	peak := func() (stop func() uint64) {
		done, out := make(chan struct{}), make(chan uint64)
		go func() {
			s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
			var high uint64
			for {
				metrics.Read(s)
				high = max(high, s[0].Value.Uint64())
				select {
				case <-done:
					out <- high
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		return func() uint64 { close(done); return <-out }
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := heap()
	idx := &quota.Index{}
	snap := filepath.Join(t.TempDir(), "snap.bin")
	s := &quota.Syncer{Store: p, Index: idx, SnapshotPath: snap}
	stop := peak()
	start, cpu0 := time.Now(), cpu()
	if err := s.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	took, tookCPU := time.Since(start), cpu()-cpu0
	high := stop()
	s.Wait()
	after := heap()
	if idx.Len() != n {
		t.Fatalf("loaded %d quotas, want %d", idx.Len(), n)
	}
	t.Logf("load from PostgreSQL: %d quotas in %v (this process's CPU %v; the rest is PostgreSQL and a shared box); heap %.0f MB (%.0f B a key), at most %.0f MB during the load", n, took.Round(time.Millisecond), tookCPU.Round(time.Millisecond),
		float64(after-before)/(1<<20), float64(after-before)/float64(n), float64(high-before)/(1<<20))

	down, _ := quota.NewPostgres("postgres://postgres@127.0.0.1:1/none?connect_timeout=1")
	defer down.Close()
	idx2 := &quota.Index{}
	before = heap()
	stop = peak()
	start, cpu0 = time.Now(), cpu()
	if err := (&quota.Syncer{Store: down, Index: idx2, SnapshotPath: snap}).Start(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	took, tookCPU = time.Since(start), cpu()-cpu0
	high = stop()
	after = heap()
	if idx2.Len() != n {
		t.Fatalf("loaded %d quotas from the snapshot, want %d", idx2.Len(), n)
	}
	fi, _ := os.Stat(snap)
	t.Logf("load from the snapshot file (%.0f MB) with PostgreSQL down: %d quotas in %v (CPU %v); heap %.0f MB (%.0f B a key), at most %.0f MB during the load", float64(fi.Size())/(1<<20), idx2.Len(),
		took.Round(time.Millisecond), tookCPU.Round(time.Millisecond), float64(after-before)/(1<<20), float64(after-before)/float64(n), float64(high-before)/(1<<20))
	runtime.KeepAlive(idx)
	runtime.KeepAlive(idx2)
}

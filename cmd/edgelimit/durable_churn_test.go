// The race detector slows the 24 simulated hours of churn tenfold (minutes):
// this file's test and benchmark run without it.

//go:build !race

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
	"github.com/edgelimit/edgelimit/replication"
)

// churnRules are limits of every scope and several window lengths: keys of
// second windows churn fastest.
const churnRules = `domain: churn
descriptors:
  - key: s
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: m
    rate_limit: {unit: minute, requests_per_unit: 100, scope: region}
  - key: h
    rate_limit: {unit: hour, requests_per_unit: 100, scope: global}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket}
`

func churnLimits(t testing.TB) []limit.Item {
	t.Helper()
	f := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(f, []byte(churnRules), 0o644); err != nil {
		t.Fatal(err)
	}
	set, _, err := rules.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	var items []limit.Item
	for _, l := range set.Limits() {
		items = append(items, limit.Item{Spec: l.Spec, Scope: limit.Scope(l.Scope),
			Key: l.AppendKey(nil, []rules.Entry{{Key: l.Path, Value: ""}})})
	}
	return items
}

// durableNode is a PoP's store, its DB and the two drivers that save it, on
// an injected clock.
type durableNode struct {
	mem    *store.Memory
	db     *replication.DB
	counts *replication.Persisted
	keeper *replication.Keeper
}

func newDurableNode(t testing.TB, dir string, fs vfs.FS) *durableNode {
	t.Helper()
	mem := store.NewMemory(store.MemoryConfig{Durable: true, Replica: "a", RegionPeers: []string{"b"}, MaxKeys: 4 << 20})
	db, err := replication.OpenDB(dir, "a", &replication.DBOptions{FS: fs, MinFreeBytes: -1, BallastBytes: -1,
		Logger: replication.PebbleLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	n := &durableNode{mem: mem, db: db, counts: replication.NewPersisted(mem, db, nil)}
	n.keeper = replication.NewKeeper(replication.KeeperConfig{DB: db,
		TakeStates: func() ([]replication.StateRecord, []string) {
			changed, gone := mem.TakeStates()
			out := make([]replication.StateRecord, len(changed))
			for i, r := range changed {
				out[i] = replication.StateRecord{Key: r.Key, Value: r.Value}
			}
			return out, gone
		},
		ResaveAll: mem.ResaveAll, WindowLength: rules.KeyWindow})
	return n
}

// restore loads the DB into the node's store, as a restart does.
func (n *durableNode) restore(t testing.TB, now int64) int {
	t.Helper()
	loaded, _, err := n.db.LoadStates(now, func(key string, value []byte) error {
		_, err := n.mem.RestoreState(now, key, value)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.counts.RestoreFrom(); err != nil {
		t.Fatal(err)
	}
	return loaded
}

// check admits one hit of each limit for the key named by id.
func (n *durableNode) check(items []limit.Item, id string, now int64) {
	its := make([]limit.Item, len(items))
	for i, it := range items {
		its[i] = it
		its[i].Key = append([]byte(id+"|"), it.Key...)
	}
	out := make([]limit.Decision, 1)
	for i := range its {
		n.mem.CheckAt(context.Background(), now, 1, its[i:i+1], out)
	}
}

// save is one flush interval's work of both drivers.
func (n *durableNode) save(t testing.TB, now int64) {
	t.Helper()
	if err := n.keeper.SaveAt(time.Unix(0, now)); err != nil {
		t.Fatal(err)
	}
	if err := n.counts.Save(n.mem.Delta()); err != nil {
		t.Fatal(err)
	}
}

// Twenty-four simulated hours of window churn — 300 new keys a simulated
// minute on second, minute and hour windows of every scope, and a token
// bucket, with the store's sweep, the saves and DropExpired on an injected
// clock — leave the data directory no bigger than the live windows need:
// its size levels off within the first hours instead of growing with time.
// Before, old windows were never deleted (DropBefore had no caller).
func TestDurableSizeBoundedUnderChurn(t *testing.T) {
	items := churnLimits(t)
	fs := vfs.NewMem()
	n := newDurableNode(t, "state", fs)
	defer n.db.Close()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	var sizes []uint64 // after each simulated hour
	id := 0
	for minute := 1; minute <= 24*60; minute++ {
		for range 300 {
			id++
			n.check(items, fmt.Sprint("k", id), now)
		}
		now += int64(time.Minute)
		n.mem.SweepAt(now)
		n.save(t, now)
		n.keeper.DropAt(time.Unix(0, now))
		if minute%60 == 0 {
			n.db.Compact()
			sizes = append(sizes, n.db.Stats().DiskBytes)
		}
	}
	t.Logf("data directory size after each simulated hour (KiB): %v", kib(sizes))
	peakEarly := max(sizes[1], sizes[2], sizes[3])
	for h, s := range sizes[4:] {
		if s > peakEarly*3/2 {
			t.Fatalf("after %dh the data directory holds %d KiB, over 1.5× its size in hours 2-4 (%d KiB): it grows with time",
				h+5, s>>10, peakEarly>>10)
		}
	}
}

func kib(s []uint64) []uint64 {
	out := make([]uint64, len(s))
	for i, v := range s {
		out[i] = v >> 10
	}
	return out
}

// BenchmarkRestart1M times a restart with a million keys across every scope
// (a third each of pop, region and global limits, on real disk after a clean
// stop): open the directory, restore the saved states and the replicated
// counts into a new store. The PoP serves only after that.
func BenchmarkRestart1M(b *testing.B) {
	items := churnLimits(b)[:3] // s (pop), m (region), h (global)
	dir := filepath.Join(b.TempDir(), "state")
	n := newDurableNode(b, dir, nil)
	now := time.Now().UnixNano()
	for i := range 1_000_000 / len(items) {
		n.check(items, fmt.Sprint("k", i), now)
	}
	n.save(b, now)
	if err := n.db.Close(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		m := newDurableNode(b, dir, nil)
		t1 := time.Now()
		loaded := m.restore(b, now)
		b.StopTimer()
		b.Logf("open %v, restore %v", t1.Sub(t0), time.Since(t1))
		if own := len(m.mem.Own()); loaded+own < 990_000 {
			b.Fatalf("restored %d states and %d replicated slots, want a million", loaded, own)
		}
		m.db.Close()
		b.StartTimer()
	}
}

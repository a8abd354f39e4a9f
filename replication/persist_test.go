package replication

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/replication/core"
)

// memCounts is a minimal Counts for tests: a crdt.Local and a crdt.Counters.
type memCounts struct {
	mu     sync.Mutex
	own    *crdt.Local
	remote crdt.Counters
}

func newMemCounts(replica string) *memCounts { return &memCounts{own: crdt.NewLocal(replica)} }

func (m *memCounts) add(key string, window int64, n uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.own.Add(key, window, n)
}
func (m *memCounts) Delta() []crdt.Slot { m.mu.Lock(); defer m.mu.Unlock(); return m.own.Delta() }
func (m *memCounts) Own() []crdt.Slot   { m.mu.Lock(); defer m.mu.Unlock(); return m.own.Slots() }
func (m *memCounts) Restore(s []crdt.Slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.own.Restore(s...)
}
func (m *memCounts) Apply(_ int64, s []crdt.Slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.remote.Join(s...)
}
func (m *memCounts) Remote() []crdt.Slot { m.mu.Lock(); defer m.mu.Unlock(); return m.remote.Slots() }

func TestPersistedSavesBeforeItPublishes(t *testing.T) {
	dir := t.TempDir()
	db, err := OpenDB(dir, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newMemCounts("a")
	p := NewPersisted(c, db, nil)
	// The core drives the saves: Ready.Save before Ready.Messages.
	const t0 = int64(1_000_000_000)
	flush := int64(core.DefaultFlushInterval)
	rc, err := core.New(core.Config{Region: "eu", POP: "a", Counts: p, SnapshotInterval: time.Hour}, t0)
	if err != nil {
		t.Fatal(err)
	}
	tick := func(now int64) core.Ready {
		rc.Tick(now)
		rd := rc.Ready()
		rc.Advance(rd)
		return rd
	}
	c.add("k", 0, 3)
	p.Apply(0, []crdt.Slot{{Key: "k", Window: 0, Replica: "b", Count: 5}})
	p.Applied(42)
	rd := tick(t0 + flush)
	if own, _, _, _ := db.Load(); len(own) != 0 {
		t.Fatalf("Delta saved %v as a side effect", own)
	}
	if err := p.Save(rd.Save); err != nil {
		t.Fatal(err)
	}
	published := rd.Messages[len(rd.Messages)-1].Slots
	if len(published) != 1 || published[0].Count != 3 || !slices.Equal(rd.Save, published) {
		t.Fatalf("published %v, saved %v", published, rd.Save)
	}
	// What was published is on disk, with the remote slot and the position.
	own, remote, seq, err := db.Load()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(own, published) || len(remote) != 1 || remote[0].Count != 5 || seq != 42 {
		t.Fatalf("on disk: own %v remote %v seq %d", own, remote, seq)
	}

	// A failed save publishes nothing and keeps the slots for later.
	c.add("k", 0, 1)
	db.Close()
	rd = tick(t0 + 2*flush)
	if err := p.Save(rd.Save); err == nil {
		t.Fatal("save into a closed DB succeeded")
	}
	for _, m := range rd.Messages {
		rc.Failed(m) // not published
	}
	db2, err := OpenDB(dir, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	p.db = db2
	rd = tick(t0 + 3*flush)
	if err := p.Save(rd.Save); err != nil {
		t.Fatal(err)
	}
	if got := rd.Save; len(got) != 1 || got[0].Count != 4 {
		t.Fatalf("after the store recovered, published %v, want the kept slot at 4", got)
	}

	// A restarted PoP restores what was saved before it serves.
	c2 := newMemCounts("a")
	p2 := NewPersisted(c2, db2, nil)
	seq, err = p2.RestoreFrom()
	if err != nil || seq != 42 {
		t.Fatalf("restore: seq %d, %v", seq, err)
	}
	if got := c2.Own(); len(got) != 1 || got[0].Count != 4 {
		t.Fatalf("restored own %v", got)
	}
	if got := c2.Remote(); len(got) != 1 || got[0].Count != 5 {
		t.Fatalf("restored remote %v", got)
	}
}

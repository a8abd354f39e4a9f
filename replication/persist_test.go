package replication

import (
	"slices"
	"sync"
	"testing"

	"github.com/edgelimit/edgelimit/crdt"
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
func (m *memCounts) Apply(s []crdt.Slot) { m.mu.Lock(); defer m.mu.Unlock(); m.remote.Join(s...) }
func (m *memCounts) Remote() []crdt.Slot { m.mu.Lock(); defer m.mu.Unlock(); return m.remote.Slots() }

func TestPersistedSavesBeforeItPublishes(t *testing.T) {
	dir := t.TempDir()
	db, err := OpenDB(dir, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newMemCounts("a")
	p := NewPersisted(c, db, nil)
	c.add("k", 0, 3)
	p.Apply([]crdt.Slot{{Key: "k", Window: 0, Replica: "b", Count: 5}})
	p.Applied(42)
	published := p.Delta()
	if len(published) != 1 || published[0].Count != 3 {
		t.Fatalf("published %v", published)
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
	if got := p.Delta(); got != nil {
		t.Fatalf("published %v although the save failed", got)
	}
	db2, err := OpenDB(dir, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	p.db = db2
	if got := p.Delta(); len(got) != 1 || got[0].Count != 4 {
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

package replication

import (
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/edgelimit/edgelimit/crdt"
)

// Persisted wraps a PoP's Counts so that every delta is durable in db before
// anyone can publish it: Delta saves the own slots it returns, together with
// the remote slots applied since the last save and the stream position, in
// one synced Pebble batch, and returns them only once that batch is on disk.
// When the save fails it returns nothing and keeps the slots for the next
// call, so a value is never published that a restart could forget — which is
// what keeps a replica's published values from ever going backwards.
//
// Restore a PoP with RestoreFrom before it serves its first check.
// A Persisted is safe for concurrent use.
type Persisted struct {
	Counts
	db  *DB
	log *slog.Logger

	mu      sync.Mutex
	pending []crdt.Slot // own slots whose save failed: saved and published next time
	remote  []crdt.Slot // remote slots applied since the last save
	seq     uint64      // stream position of the last applied batch
}

// NewPersisted wraps counts with db. logger may be nil.
func NewPersisted(counts Counts, db *DB, logger *slog.Logger) *Persisted {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Persisted{Counts: counts, db: db, log: logger}
}

// RestoreFrom loads the durable state into the counts: own counts are
// restored (never lowered) and remote ones joined. It returns the stream
// position to resume consuming after.
func (p *Persisted) RestoreFrom() (uint64, error) {
	own, remote, seq, err := p.db.Load()
	if err != nil {
		return 0, err
	}
	p.Counts.Restore(own)
	p.Counts.Apply(remote)
	p.mu.Lock()
	p.seq = seq
	p.mu.Unlock()
	return seq, nil
}

// Delta returns the own slots changed since the last call once they are
// saved, with everything applied since the last save; see Persisted.
func (p *Persisted) Delta() []crdt.Slot {
	own := p.Counts.Delta()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) > 0 {
		own = append(p.pending, own...) // absolute values: the later of two wins on join
		p.pending = nil
	}
	if len(own) == 0 && len(p.remote) == 0 {
		return nil
	}
	if err := p.db.SaveFlush(own, p.remote, p.seq); err != nil {
		p.log.Error("replication: saving the flush failed; nothing is published until it succeeds", "err", err, "slots", len(own))
		p.pending = own
		return nil
	}
	p.remote = p.remote[:0]
	return own
}

// Apply joins remote slots into the counts and remembers them for the next save.
func (p *Persisted) Apply(remote []crdt.Slot) {
	p.Counts.Apply(remote)
	p.mu.Lock()
	p.remote = append(p.remote, remote...)
	p.mu.Unlock()
}

// Applied records the stream position of the last applied batch; the next
// save stores it, so that a restart resumes after it.
func (p *Persisted) Applied(seq uint64) {
	p.mu.Lock()
	if seq > p.seq {
		p.seq = seq
	}
	p.mu.Unlock()
}

// PebbleLogger sends Pebble's log lines to l: its routine messages (WAL
// recovery, compactions) at debug level, its errors at error level. Pebble's
// Fatalf, for corruption it cannot continue past, logs and exits.
func PebbleLogger(l *slog.Logger) pebble.Logger { return pebbleLog{l} }

type pebbleLog struct{ l *slog.Logger }

func (p pebbleLog) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
}

func (p pebbleLog) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

func (p pebbleLog) Fatalf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
	os.Exit(1)
}

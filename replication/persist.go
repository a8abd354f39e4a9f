package replication

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/replication/core"
)

// Persisted wraps a PoP's Counts with its durable state in db. Save writes
// the own slots a flush is about to publish, together with the remote slots
// applied since the last save and the stream position, in one synced Pebble
// batch; the driver publishes those slots only once Save returned nil
// (core.Ready.Save), so a value is never published that a restart could
// forget — which is what keeps a replica's published values from ever going
// backwards. Delta is the wrapped store's, with no side effect.
//
// Restore a PoP with RestoreFrom before it serves its first check.
// A Persisted is safe for concurrent use.
type Persisted struct {
	Counts
	db  *DB
	log *slog.Logger

	mu     sync.Mutex
	remote []crdt.Slot // remote slots applied since the last save
	seq    uint64      // stream position of the last applied batch
}

// NewPersisted wraps counts with db. logger may be nil.
func NewPersisted(counts Counts, db *DB, logger *slog.Logger) *Persisted {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Persisted{Counts: counts, db: db, log: logger}
}

// Urgent passes on the wrapped counts' signal (UrgentNotifier) that an
// admission is worth publishing before the next flush; nil, a channel that
// never receives, when they give none.
func (p *Persisted) Urgent() <-chan struct{} {
	if n, ok := p.Counts.(UrgentNotifier); ok {
		return n.Urgent()
	}
	return nil
}

// Beacon passes a presence beacon on to the wrapped counts (BeaconCounts).
func (p *Persisted) Beacon(pop string) {
	if b, ok := p.Counts.(BeaconCounts); ok {
		b.Beacon(pop)
	}
}

// Hot passes on the wrapped counts' hot slots (HotCounts); none when they
// tell none.
func (p *Persisted) Hot(slots []crdt.Slot) []crdt.Slot {
	if h, ok := p.Counts.(HotCounts); ok {
		return h.Hot(slots)
	}
	return nil
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
	p.Counts.Apply(0, remote)
	p.mu.Lock()
	p.seq = seq
	p.mu.Unlock()
	return seq, nil
}

// DeltaAt is the store's DeltaAt when it has one (core.CountsAt: counters
// taken at the core's now), else its Delta. Persisted must pass it on: the
// core asks for it only if the Counts it holds, this one, has it.
func (p *Persisted) DeltaAt(now int64) []crdt.Slot {
	if ca, ok := p.Counts.(core.CountsAt); ok {
		return ca.DeltaAt(now)
	}
	return p.Counts.Delta()
}

// OwnAt is the store's OwnAt when it has one, else its Own.
func (p *Persisted) OwnAt(now int64) []crdt.Slot {
	if ca, ok := p.Counts.(core.CountsAt); ok {
		return ca.OwnAt(now)
	}
	return p.Counts.Own()
}

// Save makes own durable, with everything applied since the last save and
// the stream position, in one synced batch (DB.SaveFlush). On error nothing
// of own may be published; the applied slots stay for the next Save.
func (p *Persisted) Save(own []crdt.Slot) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(own) == 0 && len(p.remote) == 0 {
		return nil
	}
	if err := p.db.SaveFlush(own, p.remote, p.seq); err != nil {
		if !errors.Is(err, ErrDiskFull) { // a full disk is logged, rate-limited, by the Keeper
			p.log.Error("replication: saving the flush failed; nothing is published until it succeeds", "err", err, "slots", len(own))
		}
		return fmt.Errorf("replication: save %d own slots: %w", len(own), err)
	}
	p.remote = p.remote[:0]
	return nil
}

// Apply joins remote slots into the counts and remembers them for the next save.
func (p *Persisted) Apply(sent int64, remote []crdt.Slot) {
	p.Counts.Apply(sent, remote)
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

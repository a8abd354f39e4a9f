package replication

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// KeeperConfig configures a Keeper.
type KeeperConfig struct {
	// DB is where the states go.
	DB *DB
	// TakeStates returns what the store changed since the last call: the
	// records of keys that admitted hits and the keys it removed
	// (store.Memory.TakeStates, adapted by cmd).
	TakeStates func() (changed []StateRecord, gone []string)
	// ResaveAll makes the store's next TakeStates return every key: called
	// when a save failed, so that nothing it took is lost.
	ResaveAll func()
	// Interval is how often states are saved: a kill -9 loses the hits
	// admitted since the last save that succeeded. 0 means 100ms.
	Interval time.Duration
	// DropInterval is how often windows past for good are deleted from the
	// DB (DB.DropExpired); 0 means one minute.
	DropInterval time.Duration
	// WindowLength tells a slot key's window length (rules.KeyWindow); nil
	// deletes no windows.
	WindowLength func(key string) (time.Duration, bool)
	Logger       *slog.Logger
}

// Keeper is the driver that makes a PoP's own table durable, whether or not
// it replicates: every Interval it saves what the store changed
// (DB.SaveStates), every DropInterval it deletes windows past for good
// (DB.DropExpired), and it reports the disk's trouble for /readyz. A save
// that fails — a full disk above all — keeps the PoP deciding from memory;
// the store resaves everything with the next save that succeeds, and the
// trouble is logged when it starts, every 30 s while it lasts, and when it
// ends (not at every attempt). Safe for concurrent use.
type Keeper struct {
	cfg KeeperConfig
	log *slog.Logger

	saves    atomic.Uint64
	failures atomic.Uint64
	dropped  atomic.Uint64

	mu      sync.Mutex
	err     error     // the last save's failure; requires mu
	since   time.Time // when it began; requires mu
	lastLog time.Time // requires mu
}

// keeperLogEvery is how often a failure that lasts is logged again.
const keeperLogEvery = 30 * time.Second

// NewKeeper returns a Keeper; call Run.
func NewKeeper(cfg KeeperConfig) *Keeper {
	if cfg.Interval <= 0 {
		cfg.Interval = 100 * time.Millisecond
	}
	if cfg.DropInterval <= 0 {
		cfg.DropInterval = time.Minute
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Keeper{cfg: cfg, log: log}
}

// Run saves every Interval and drops expired windows every DropInterval
// until ctx ends, then saves once more (a clean stop loses nothing). It
// returns nil.
func (k *Keeper) Run(ctx context.Context) error {
	k.note(k.Ready(), time.Now()) // a disk full at start is logged at start
	save := time.NewTicker(k.cfg.Interval)
	defer save.Stop()
	drop := time.NewTicker(k.cfg.DropInterval)
	defer drop.Stop()
	for {
		select {
		case <-ctx.Done():
			k.SaveAt(time.Now())
			return nil
		case now := <-save.C:
			k.SaveAt(now)
		case now := <-drop.C:
			k.DropAt(now)
		}
	}
}

// SaveAt saves what the store changed since the last save, at now (the time
// only dates the log lines). On failure the store is told to resave
// everything next time.
func (k *Keeper) SaveAt(now time.Time) error {
	changed, gone := k.cfg.TakeStates()
	err := k.cfg.DB.SaveStates(changed, gone)
	if err != nil && !errors.Is(err, ErrDBClosed) {
		k.cfg.ResaveAll()
		k.failures.Add(1)
	} else {
		k.saves.Add(1)
	}
	k.note(err, now)
	return err
}

// DropAt deletes the windows past for good at now.
func (k *Keeper) DropAt(now time.Time) {
	if k.cfg.WindowLength == nil {
		return
	}
	n, err := k.cfg.DB.DropExpired(now.UnixNano(), k.cfg.WindowLength)
	if err != nil {
		k.note(err, now)
		return
	}
	k.dropped.Add(uint64(n))
}

// note records the outcome of a write and logs a change.
func (k *Keeper) note(err error, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case err == nil && k.err != nil:
		k.log.Info("durable state: saving again", "down_for", now.Sub(k.since).Round(time.Millisecond).String())
		k.err = nil
	case err != nil && k.err == nil:
		k.err, k.since, k.lastLog = err, now, now
		k.log.Error("durable state: cannot save; deciding from memory, not ready, retrying with backoff "+
			"(hits admitted meanwhile are lost if the PoP stops before a save succeeds)", "err", err)
	case err != nil:
		k.err = err
		if now.Sub(k.lastLog) >= keeperLogEvery {
			k.lastLog = now
			k.log.Error("durable state: still cannot save", "err", err, "failing_for", now.Sub(k.since).Round(time.Second).String())
		}
	}
}

// Ready returns why the durable state is not being saved, or nil.
func (k *Keeper) Ready() error {
	if err := k.cfg.DB.DiskFull(); err != nil {
		return err
	}
	if err := k.cfg.DB.Damaged(); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// KeeperStats counts a Keeper's work.
type KeeperStats struct {
	Saves, SaveFailures, DroppedSlots uint64
}

// Stats returns the Keeper's counters.
func (k *Keeper) Stats() KeeperStats {
	return KeeperStats{Saves: k.saves.Load(), SaveFailures: k.failures.Load(), DroppedSlots: k.dropped.Load()}
}

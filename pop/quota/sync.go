package quota

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultPoll is how often a Syncer asks the store for changes when no
// notification came: the backstop for a lost notification.
const DefaultPoll = 10 * time.Second

// DefaultSyncTimeout is Syncer.Timeout's default.
const DefaultSyncTimeout = 10 * time.Second

// compactAfter is how long changes must be quiet before the index's delta is
// folded into its base.
const compactAfter = 2 * time.Second

// Syncer keeps an Index up to date from a Store: it loads the whole snapshot
// at start, then reads the changes after the version it holds whenever the
// store notifies a write (PostgreSQL's LISTEN/NOTIFY), and every Poll as a
// backstop. With SnapshotPath set, it keeps the last snapshot there, and
// when the store cannot be read at start it enforces that file's quotas until
// the store answers again.
type Syncer struct {
	Store Store
	Index *Index
	// SnapshotPath is the file of the last snapshot ("": none).
	SnapshotPath string
	// Poll is the backstop interval; 0 means DefaultPoll.
	Poll time.Duration
	// Timeout is how long one sync waits for the store before it counts as
	// failed (Reachable false); 0 means DefaultSyncTimeout.
	Timeout time.Duration
	Logger  *slog.Logger
	// Synced, when set, is called after each sync that changed the index
	// with the version now in force (for tests and metrics).
	Synced func(version int64)

	loaded atomic.Bool // the index reflects the store (not only the file)
	down   atomic.Bool // the last read of the store failed
	saving atomic.Bool
	savedV atomic.Int64 // the version last written to SnapshotPath
	saves  sync.WaitGroup
}

// Reachable reports whether the last read of the store (the load at start,
// then each sync) succeeded; while it is false the quotas last read (or the
// snapshot file's) stay in force.
func (s *Syncer) Reachable() bool { return !s.down.Load() }

// Loaded reports whether the index has been loaded from the store itself
// (false while it holds only the snapshot file's quotas).
func (s *Syncer) Loaded() bool { return s.loaded.Load() }

func (s *Syncer) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// Start loads the index: from the store, or — when the store does not answer
// within timeout — from the snapshot file. It fails only when neither works
// and a snapshot file exists but is damaged; with no file, the index starts
// empty and Run loads it once the store answers.
func (s *Syncer) Start(ctx context.Context, timeout time.Duration) error {
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer bulkLoad()()
	err := s.full(lctx)
	s.down.Store(err != nil)
	if err == nil {
		return nil
	}
	if s.SnapshotPath == "" {
		s.log().Error("quotas: the store does not answer; starting without quotas until it does", "err", err)
		return nil
	}
	// Built as the file is read: the quotas are not held twice.
	var b *builder
	v, ferr := readSnapshotEach(s.SnapshotPath, func(n, keyBytes int) { b = s.Index.builder(n, keyBytes) }, func(q *Quota) { b.add(q) })
	switch {
	case errors.Is(ferr, os.ErrNotExist):
		s.log().Error("quotas: the store does not answer and there is no snapshot; starting without quotas until it does", "err", err)
		return nil
	case ferr != nil:
		return ferr
	}
	s.Index.replaceTable(b.seed, b.t, b.ps, v)
	s.log().Warn("quotas: the store does not answer; enforcing the last snapshot until it does", "err", err, "file", s.SnapshotPath, "quotas", b.t.n, "version", v)
	return nil
}

// tableLoader is a Store that builds an Index's table while it reads its
// snapshot (Postgres), sparing a second pass over a million keys.
type tableLoader interface {
	snapshotTable(ctx context.Context, seed maphash.Seed) (table, plans, int64, error)
}

// full replaces the index with the store's snapshot.
func (s *Syncer) full(ctx context.Context) error {
	defer bulkLoad()()
	var n int
	var v int64
	if tl, ok := s.Store.(tableLoader); ok {
		seed := s.Index.seed()
		t, ps, tv, err := tl.snapshotTable(ctx, seed)
		if err != nil {
			return err
		}
		s.Index.replaceTable(seed, t, ps, tv)
		n, v = t.n, tv
	} else {
		all, av, err := s.Store.Snapshot(ctx)
		if err != nil {
			return err
		}
		s.Index.Replace(all, av)
		n, v = len(all), av
	}
	s.loaded.Store(true)
	s.log().Info("quotas loaded", "quotas", n, "version", v)
	s.synced(v)
	return nil
}

// step brings the index up to date: the whole snapshot when it was never
// loaded from the store, else the changes since its version.
func (s *Syncer) step(ctx context.Context) error {
	if !s.loaded.Load() {
		return s.full(ctx)
	}
	for {
		from := s.Index.Version()
		changes, v, err := s.Store.ChangesSince(ctx, from)
		if err != nil {
			return err
		}
		if v == from {
			return nil
		}
		s.Index.Apply(changes, v)
		s.synced(v)
		if len(changes) == 0 {
			return nil
		}
	}
}

func (s *Syncer) synced(v int64) {
	if s.Synced != nil {
		s.Synced(v)
	}
	s.save()
}

// save writes the snapshot file in the background, one write at a time; a
// change during a write is saved by the next sync or the next poll.
func (s *Syncer) save() {
	if s.SnapshotPath == "" || !s.loaded.Load() || s.Index.Version() == s.savedV.Load() || !s.saving.CompareAndSwap(false, true) {
		return
	}
	// The snapshot in force is immutable: the file is written from it as
	// it is, with no copy of a million quotas.
	view := s.Index.view()
	if view == nil {
		s.saving.Store(false)
		return
	}
	v := view.version
	s.saves.Add(1)
	go func() {
		defer s.saves.Done()
		defer s.saving.Store(false)
		if err := writeSnapshotOf(s.SnapshotPath, v, view.len(), view.quotas()); err != nil {
			s.log().Error("quotas: cannot save the snapshot", "file", s.SnapshotPath, "err", err)
			return
		}
		s.savedV.Store(v)
	}()
}

// Run follows the store until ctx ends: a notification or the poll timer
// triggers a sync, which fails past Timeout; a failed listener is restarted
// with backoff (watch). It returns once the listener and any snapshot write
// have finished.
func (s *Syncer) Run(ctx context.Context) {
	defer s.saves.Wait()
	kick := make(chan struct{}, 1)
	changed := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	listening := make(chan struct{})
	defer func() { <-listening }()
	go func() {
		defer close(listening)
		s.watch(ctx, changed)
	}()
	poll := s.Poll
	if poll <= 0 {
		poll = DefaultPoll
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultSyncTimeout
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	// Once changes are quiet for compactAfter, the index's delta is folded
	// into its base, so that a lookup is one map probe again.
	compact := time.NewTimer(time.Hour)
	compact.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-t.C:
			s.save() // a save skipped while another ran
		case <-compact.C:
			s.Index.Compact()
			continue
		}
		// A deadline of its own: a store that accepts and never answers
		// (a dropped route, a hung server) fails the sync, so that the
		// store is reported down and the next poll tries again, instead
		// of one read waiting for good.
		sctx, cancel := context.WithTimeout(ctx, timeout)
		err := s.step(sctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		s.down.Store(err != nil)
		if err != nil {
			if !failing {
				s.log().Error("quotas: cannot read the store; the last quotas stay in force", "err", err)
			}
			failing = true
			continue
		}
		if failing {
			s.log().Info("quotas: the store answers again", "version", s.Index.Version())
		}
		failing = false
		if s.Index.Pending() > 0 {
			compact.Reset(compactAfter)
		}
	}
}

// Bounds of the listener's restarts (watch).
const (
	watchRetryMin = time.Second
	watchRetryMax = 30 * time.Second
	// watchLogEvery is how often a listener that keeps failing is logged
	// again (with the count of failures since).
	watchLogEvery = 5 * time.Minute
)

// watch runs the store's listener until ctx ends, restarting it when it
// fails: after watchRetryMin, doubling up to watchRetryMax while it keeps
// failing, so that a store that is down costs a connection attempt every
// watchRetryMax, not every second. A listener that ran for watchRetryMax
// before it failed counts as having worked: the next retry waits
// watchRetryMin. A run of failures is logged at its first, every
// watchLogEvery while it lasts, and when the listener works again; the poll
// (Run) keeps the quotas current meanwhile.
func (s *Syncer) watch(ctx context.Context, changed func()) {
	wait := watchRetryMin
	var failures int
	var logged time.Time
	for ctx.Err() == nil {
		start := time.Now()
		err := s.Store.Watch(ctx, changed)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) >= watchRetryMax {
			if failures > 0 {
				s.log().Info("quotas: change notifications work again", "failures", failures)
			}
			wait, failures = watchRetryMin, 0
		}
		if err != nil {
			failures++
			if failures == 1 || time.Since(logged) >= watchLogEvery {
				logged = time.Now()
				s.log().Warn("quotas: change notifications failed; polling until they work again", "err", err,
					"failures", failures, "retry_in", wait.String())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if err != nil {
			wait = min(2*wait, watchRetryMax)
		}
	}
}

// Wait waits for a snapshot write in flight (Run waits for it too).
func (s *Syncer) Wait() { s.saves.Wait() }

// loadGCPercent is the garbage collector's target while a whole snapshot
// loads. Loading a million quotas grows the heap from nearly nothing to
// ~150 MB of live data with little garbage; at the default 100 the collector
// runs at every doubling and marks everything loaded so far each time (a
// quarter of the load's CPU, measured). At 400 it runs two or three times.
// The peak heap barely changes: what a load allocates stays live.
const loadGCPercent = 400

// bulkLoad raises the collector's target for a bulk load and returns the
// function that restores it. Loads may overlap (several PoPs in one process,
// as edgelimit demo runs them; Start calls full): the first raises the
// target, the last restores the one it found. A process that runs with a
// higher target, or with the collector off (GOGC=off), keeps its own.
func bulkLoad() (restore func()) {
	loads.mu.Lock()
	defer loads.mu.Unlock()
	if loads.n == 0 {
		loads.prev = debug.SetGCPercent(loadGCPercent)
		if loads.prev < 0 || loads.prev >= loadGCPercent {
			debug.SetGCPercent(loads.prev)
		}
	}
	loads.n++
	var once sync.Once
	return func() {
		once.Do(func() {
			loads.mu.Lock()
			defer loads.mu.Unlock()
			if loads.n--; loads.n == 0 {
				debug.SetGCPercent(loads.prev)
			}
		})
	}
}

// loads counts the bulk loads in progress (bulkLoad).
var loads struct {
	mu   sync.Mutex
	n    int
	prev int // the target before the first of them
}

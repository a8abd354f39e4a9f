package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/node"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/replication"
)

// durable is a PoP's Pebble directory (--data/state), opened once and shared
// by the Keeper, which saves the store's own table, and by replication,
// which saves the replicated counts (replicator).
type durable struct {
	dir      string
	replica  string // "" without --pop
	interval time.Duration
	minFree  int64
	log      *slog.Logger

	mu    sync.Mutex
	db    *replication.DB // requires mu
	users int             // open calls not yet released; requires mu
}

// open opens the directory, or hands out the DB already open: replication
// and the Keeper share it. Each successful open is paired with a release;
// the last release closes the DB, after its user's last save.
func (d *durable) open() (*replication.DB, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.db == nil {
		db, err := replication.OpenDB(filepath.Join(d.dir, "state"), d.replica,
			&replication.DBOptions{Logger: replication.PebbleLogger(d.log), MinFreeBytes: d.minFree})
		if err != nil {
			return nil, err
		}
		d.db = db
	}
	d.users++
	return d.db, nil
}

// release ends one open; the last closes the DB.
func (d *durable) release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.users--; d.users == 0 && d.db != nil {
		if err := d.db.Close(); err != nil {
			d.log.Warn("durable state: close", "err", err)
		}
		d.db = nil
	}
}

// hook is node.Config.Durable: restore the store's saved states before the
// PoP serves, then keep saving them.
func (d *durable) hook(ctx context.Context, h node.DurableHooks) (func() error, func() error, error) {
	db, err := d.open()
	if err != nil {
		return nil, nil, err
	}
	start := time.Now()
	loaded, expired, err := db.LoadStates(start.UnixNano(), func(key string, value []byte) error {
		_, err := h.Store.RestoreState(start.UnixNano(), key, value)
		return err
	})
	if err != nil {
		d.release()
		return nil, nil, err
	}
	leases := h.Store.Leases()
	held, _, err := db.LoadLeases(start.UnixNano(), func(id []byte, keys [][]byte, exps []int64) {
		lid := limit.LeaseID(id)
		for i, k := range keys {
			leases.RestoreLease(start.UnixNano(), lid, limit.SlotKey(k), exps[i])
		}
	})
	if err != nil {
		d.release()
		return nil, nil, err
	}
	journal := &leaseJournal{db: db, log: d.log}
	leases.SetJournal(journal)
	d.log.Info("durable state restored", "dir", filepath.Join(d.dir, "state"), "keys", loaded, "expired", expired,
		"leases", held, "took", time.Since(start).Round(time.Millisecond).String())
	k := replication.NewKeeper(replication.KeeperConfig{
		DB: db,
		TakeStates: func() ([]replication.StateRecord, []string) {
			changed, gone := h.Store.TakeStates()
			out := make([]replication.StateRecord, len(changed))
			for i, r := range changed {
				out[i] = replication.StateRecord{Key: r.Key, Value: r.Value}
			}
			return out, gone
		},
		ResaveAll:    h.Store.ResaveAll,
		Interval:     d.interval,
		WindowLength: rules.KeyWindow,
		Logger:       d.log,
	})
	registerDurable(h.Registerer, db, k)
	h.Registerer.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "edgelimit_lease_journal_failures_total",
		Help: "Concurrency lease grants the data directory could not save (a full disk): each was held in memory only, and a crash forgets it.",
	}, func() float64 { return float64(leases.JournalErrors()) }))
	run := func() error {
		defer d.release()
		stop := make(chan struct{})
		defer close(stop)
		go func() { // leases never released expire; their records go too
			t := time.NewTicker(time.Minute)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case now := <-t.C:
					if _, err := db.DropExpiredLeases(now.UnixNano()); err != nil {
						d.log.Warn("durable state: drop expired leases", "err", err)
					}
				}
			}
		}()
		return k.Run(ctx)
	}
	return run, k.Ready, nil
}

func registerDurable(reg prometheus.Registerer, db *replication.DB, k *replication.Keeper) {
	reg.MustRegister(
		errorGauge(prometheus.GaugeOpts{
			Name: "edgelimit_durable_disk_full",
			Help: "1 while the data directory's disk has less free space than --data-min-free-mib and the PoP saves nothing (it decides from memory; /readyz fails).",
		}, db.DiskFull),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgelimit_durable_saves_total", Help: "Saves of the PoP's own table to the data directory.",
		}, func() float64 { return float64(k.Stats().Saves) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgelimit_durable_save_failures_total", Help: "Saves of the PoP's own table that failed (a full disk, an IO error); each is retried.",
		}, func() float64 { return float64(k.Stats().SaveFailures) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgelimit_durable_dropped_slots_total", Help: "Replicated window slots deleted from the data directory once no check reads them.",
		}, func() float64 { return float64(k.Stats().DroppedSlots) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgelimit_durable_disk_bytes", Help: "Bytes the data directory's Pebble store uses on disk.",
		}, func() float64 { return float64(db.Stats().DiskBytes) }),
	)
}

// leaseJournal is the embedded store's store.LeaseJournal in the data
// directory: a grant is synced before it is answered (see store.LeaseJournal
// for why), a release is deleted unsynced.
type leaseJournal struct {
	db  *replication.DB
	log *slog.Logger

	mu       sync.Mutex
	failing  bool      // the last save failed; requires mu
	loggedAt time.Time // when a failure was last logged; requires mu
}

func (j *leaseJournal) SaveLease(id limit.LeaseID, keys []limit.SlotKey, exps []int64) error {
	ks := make([][]byte, len(keys))
	for i := range keys {
		ks[i] = keys[i][:]
	}
	err := j.db.SaveLease(id[:], ks, exps)
	j.note(err)
	return err
}

func (j *leaseJournal) ForgetLease(id limit.LeaseID) { j.db.ForgetLease(id[:]) }

// note logs the first failure of a run of failures, once a minute while it
// lasts, and the recovery.
func (j *leaseJournal) note(err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case err != nil && (!j.failing || time.Since(j.loggedAt) >= time.Minute):
		j.failing, j.loggedAt = true, time.Now()
		j.log.Error("durable state: concurrency leases are not being saved; they are held in memory only, and a crash forgets them", "err", err)
	case err == nil && j.failing:
		j.failing = false
		j.log.Info("durable state: concurrency leases are saved again")
	}
}

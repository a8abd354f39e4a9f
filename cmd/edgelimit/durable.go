package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	d.log.Info("durable state restored", "dir", filepath.Join(d.dir, "state"), "keys", loaded, "expired", expired,
		"took", time.Since(start).Round(time.Millisecond).String())
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
	run := func() error {
		defer d.release()
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

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/pop/node"
	"github.com/edgelimit/edgelimit/region"
	"github.com/edgelimit/edgelimit/replication"
)

// replFlags are the pop subcommand's replication settings.
type replFlags struct {
	region, pop, topology string
	natsURL               string
	natsUser, natsPass    string
	natsCreds, natsNKey   string
	natsCA                string
	natsPassFile          string
	natsCert, natsKey     string
	natsHost              string
	natsAuthorized        string
	natsAnonymous         bool                 // --nats-allow-anonymous
	natsAdminNKey         string               // --nats-admin-nkey
	maxStoreMiB, maxStore int64                // --nats-max-store-mib, and in bytes
	leafHost, leafNKey    string               // --nats-leaf-host, --nats-leaf-nkey
	natsUsers             []replication.PoPKey // read from natsAuthorized
	natsListen            int
	leafListen            int
	leafRemotes           listFlag
	natsDirect            string            // --nats-direct as given
	direct                map[string]string // from natsDirect: region -> its servers' URLs, comma-separated
	flush                 time.Duration
	urgent                time.Duration
	snapshot              time.Duration
	partitionShare        float64
	clockSync             bool
	maxClockStep          time.Duration
	unreachableAfter      time.Duration
	catchUp               time.Duration
}

// domains names each region's JetStream domain after the region: regions are
// separate domains linked by leaf nodes (see replication.StartServer).
func domains(t replication.Topology) map[string]string {
	d := map[string]string{}
	for r := range t.Regions {
		d[r] = r
	}
	return d
}

// validate checks the replication flags; replication is on when --region and
// --pop are set.
func (f *replFlags) validate() (replication.Topology, error) {
	var t replication.Topology
	if f.region == "" && f.pop == "" {
		if f.natsDirect != "" {
			return t, errors.New("--nats-direct links a replicated PoP to other regions: it needs --region and --pop")
		}
		return t, nil
	}
	if f.region == "" || f.pop == "" {
		return t, fmt.Errorf("--region and --pop go together (replication needs both)")
	}
	t, err := region.Parse(f.topology)
	if err != nil {
		return t, fmt.Errorf("--topology: %w", err)
	}
	if len(t.Regions) == 0 {
		t.Regions = map[string][]string{f.region: {f.pop}}
	}
	if t.RegionOf(f.pop) != f.region {
		return t, fmt.Errorf("--topology does not put PoP %q in region %q (regions: %s)", f.pop, f.region, strings.Join(t.Names(), ", "))
	}
	if f.flush <= 0 {
		return t, fmt.Errorf("--flush-interval must be > 0, got %v", f.flush)
	}
	if f.urgent <= 0 {
		return t, fmt.Errorf("--urgent-interval must be > 0, got %v", f.urgent)
	}
	if f.snapshot <= 0 {
		return t, fmt.Errorf("--snapshot-interval must be > 0, got %v", f.snapshot)
	}
	if f.unreachableAfter <= 0 {
		return t, fmt.Errorf("--unreachable-after must be > 0, got %v", f.unreachableAfter)
	}
	if f.catchUp < 0 {
		return t, fmt.Errorf("--catchup-timeout must be >= 0, got %v", f.catchUp)
	}
	if f.maxClockStep <= 0 {
		return t, fmt.Errorf("--max-clock-step must be > 0, got %v", f.maxClockStep)
	}
	if f.partitionShare < 0 || f.partitionShare > 1 {
		return t, fmt.Errorf("--partition-share must be between 0 and 1, got %v", f.partitionShare)
	}
	if f.natsNKey != "" {
		if _, err := nats.NkeyOptionFromSeed(f.natsNKey); err != nil {
			return t, fmt.Errorf("--nats-nkey: %w", err)
		}
	}
	if f.direct, err = parseDirect(f.natsDirect, t, f.region); err != nil {
		return t, fmt.Errorf("--nats-direct: %w", err)
	}
	return t, f.validateAuth(t)
}

// parseDirect reads --nats-direct, "region=url,url;region=url", into the
// URLs of each region's servers, comma-separated. Every region must be
// another region of t, named once, with at least one nats:// or tls:// URL.
func parseDirect(s string, t replication.Topology, own string) (map[string]string, error) {
	direct := map[string]string{}
	for _, part := range strings.Split(s, ";") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, list, ok := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want region=nats://host:4222,nats://host:4222;region=…", part)
		}
		switch _, known := t.Regions[name]; {
		case name == own:
			return nil, fmt.Errorf("region %q is this PoP's own: its batches come from --nats", name)
		case !known:
			return nil, fmt.Errorf("region %q is not in --topology (regions: %s)", name, strings.Join(t.Names(), ", "))
		case direct[name] != "":
			return nil, fmt.Errorf("region %q is named twice", name)
		}
		var urls []string
		for _, u := range strings.Split(list, ",") {
			if u = strings.TrimSpace(u); u == "" {
				continue
			}
			if !strings.HasPrefix(u, "nats://") && !strings.HasPrefix(u, "tls://") {
				return nil, fmt.Errorf("region %q: %q is not a nats:// or tls:// URL", name, u)
			}
			urls = append(urls, u)
		}
		if len(urls) == 0 {
			return nil, fmt.Errorf("region %q has no server URL", name)
		}
		direct[name] = strings.Join(urls, ",")
	}
	return direct, nil
}

// replicator returns the node's Replicate hook: restore the store from
// Pebble, connect to NATS (an embedded server unless --nats names one), and
// run the replicator with every delta persisted before it is published.
func (f *replFlags) replicator(t replication.Topology, dur *durable, log *slog.Logger) func(context.Context, node.ReplicaHooks) (func() error, func() error, error) {
	dataDir := dur.dir
	return func(ctx context.Context, h node.ReplicaHooks) (func() error, func() error, error) {
		store, bits, reg := h.Counts, h.Bits, h.Registerer
		db, err := dur.open() // the directory the durable hook opened: one Pebble store
		if err != nil {
			return nil, nil, err
		}
		counts := replication.NewPersisted(store, db, log)
		seq, err := counts.RestoreFrom()
		if err != nil {
			dur.release()
			return nil, nil, err
		}
		var cleanup []func()
		closeAll := func() {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
			dur.release()
		}
		var guard *replication.StoreGuard
		var adminKey nkeys.KeyPair
		var links *replication.LinkWatch
		var inProcess nats.InProcessConnProvider // the embedded server, when it has no client port
		url := f.natsURL
		if url == "" && len(f.leafRemotes.values) > 0 {
			links = replication.NewLinkWatch(f.leafRemotes.values)
		}
		if url == "" {
			// The stream's store is on the --data disk too: the same
			// minimum of free space guards it.
			guard = replication.NewStoreGuard(dur.minFree, log.With("component", "nats-store"))
			cfg := replication.ServerConfig{Name: f.pop, Dir: filepath.Join(dataDir, "nats"), Host: f.natsHost, Port: f.natsListen,
				Domain: f.region, Users: f.natsUsers, Logger: log.With("component", "nats"), Guard: guard, Links: links,
				MaxStore: f.maxStore, Anonymous: f.natsAnonymous}
			if len(f.natsUsers) > 0 {
				// The stream's administration goes through a key of this
				// process's own, never written: the PoPs' keys may not.
				if adminKey, err = nkeys.CreateUser(); err != nil {
					closeAll()
					return nil, nil, err
				}
				cfg.Admin, _ = adminKey.PublicKey()
			}
			if f.leafListen != 0 || len(f.leafRemotes.values) > 0 {
				cfg.Leaf = &replication.LeafConfig{Port: f.leafListen, Host: f.leafHost, RemoteNKeySeedFile: f.leafNKey}
				for _, u := range f.leafRemotes.values { // one hub region's server per URL
					cfg.Leaf.Remotes = append(cfg.Leaf.Remotes, []string{u})
				}
			}
			srv, err := replication.StartServer(cfg)
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("embedded NATS: %w", err)
			}
			cleanup = append(cleanup, srv.Shutdown)
			if err := replication.WaitReady(srv, 10*time.Second); err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("embedded NATS: %w", err)
			}
			gctx, stopGuard := context.WithCancel(ctx)
			guardDone := make(chan struct{})
			go func() { defer close(guardDone); guard.Run(gctx) }()
			cleanup = append(cleanup, func() { stopGuard(); <-guardDone })
			registerStoreGuard(reg, guard)
			if len(f.natsUsers) == 0 && !f.natsAnonymous {
				// No client port (replication.ServerConfig.Users): nothing
				// but this process can publish into replication.
				inProcess = srv
				log.Info("embedded NATS serving in process only, no client port (--nats-allow-anonymous opens one)", "domain", f.region)
			} else {
				url = srv.ClientURL()
				log.Info("embedded NATS serving", "url", url, "domain", f.region, "anonymous_clients", f.natsAnonymous)
			}
		}
		ncCfg := f.connConfig(url, "edgelimit "+f.pop, log.With("component", "nats-client"))
		if inProcess != nil {
			ncCfg.InProcess = inProcess
		}
		nc, err := replication.Connect(ncCfg)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("nats %s: %w", url, err)
		}
		cleanup = append(cleanup, nc.Close)
		if h.Strong != nil {
			// Strong limits' requests ride the PoP's own connection
			// (replication.ServeStrong says how).
			slog := log.With("component", "strong")
			sub, err := replication.ServeStrong(nc, f.region, f.pop, func() int64 { return h.Now().UnixNano() }, h.Strong.AnswerAt,
				func(err error) { slog.Debug("strong request refused", "err", err) })
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("consistency strong: %w", err)
			}
			cleanup = append(cleanup, func() { _ = sub.Unsubscribe() })
			h.Strong.SetAsker(replication.NewStrongAsker(nc, t))
		}
		admin, err := f.adminConn(url, nc, adminKey, log)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		if admin != nil && admin != nc {
			cleanup = append(cleanup, admin.Close)
		}
		direct := make(map[string]*nats.Conn, len(f.direct))
		for _, region := range slices.Sorted(maps.Keys(f.direct)) {
			// The same credentials: every server of the deployment knows
			// every PoP (edgelimit natsconf), and a PoP may subscribe to
			// every region's batches.
			dc, err := replication.Connect(f.connConfig(f.direct[region], "edgelimit "+f.pop+" direct to "+region,
				log.With("component", "nats-client", "direct_to", region)))
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("--nats-direct %s=%s: %w", region, f.direct[region], err)
			}
			cleanup = append(cleanup, dc.Close)
			direct[region] = dc
		}
		r, err := replication.New(replication.Config{
			Region: f.region, POP: f.pop, Topology: t, Conn: nc, Admin: admin, Direct: direct, MaxBytes: streamMaxBytes(f.maxStore), MaxMessageBytes: messageCap(f.maxStore), Counts: counts, Bits: bits,
			FlushInterval: f.flush, BitsInterval: f.urgent, SnapshotInterval: f.snapshot, StartSeq: seq, OnApplied: counts.Applied,
			UnreachableAfter: f.unreachableAfter, PartitionShare: f.partitionShare, SetGlobalShare: h.SetGlobalShare,
			NoClockSync: !f.clockSync, MaxClockStep: f.maxClockStep, SetClockOffset: h.SetClockOffset,
			Domains: domains(t), Bounds: h.Bounds, Logger: quietWhileFull(log.With("component", "replication"), guard),
		})
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		reg.MustRegister(replicationCollector{r})
		log.Info("replicating", "region", f.region, "pop", f.pop, "regions", len(t.Regions), "resume_after_seq", seq,
			"direct_to", strings.Join(slices.Sorted(maps.Keys(direct)), ","))
		catchUp := waitCatchUp(ctx, r, f.catchUp, h.CaughtUp, log)
		reg.MustRegister(errorGauge(prometheus.GaugeOpts{
			Name: "edgelimit_replication_catching_up",
			Help: "1 while a starting PoP has not yet applied what the other PoPs published before it started (--catchup-timeout): /readyz fails and, with --catchup-hold, checks of region and global limits wait.",
		}, catchUp))
		run := func() error {
			defer closeAll()
			err := r.Run(ctx)
			_ = counts.Save(counts.DeltaAt(time.Now().UnixNano())) // one last save of what was counted
			return err
		}
		registerStreamHealth(reg, r, links)
		if h.ReportStatus != nil {
			rs := &replStatus{r: r, nc: nc, direct: direct, unreachableAfter: f.unreachableAfter, links: links, inProcess: inProcess != nil,
				problems: []func() error{catchUp, r.StreamErr, r.JetStreamFull, links.Refused}}
			if guard != nil {
				rs.problems = append(rs.problems, guard.Full)
			}
			h.ReportStatus(rs.status)
		}
		ready := func() error {
			if err := catchUp(); err != nil {
				return err
			}
			if guard != nil {
				if err := guard.Full(); err != nil {
					return err
				}
			}
			if err := r.StreamErr(); err != nil {
				return err
			}
			if err := r.JetStreamFull(); err != nil {
				return err
			}
			return links.Refused()
		}
		return run, ready, nil
	}
}

// adminConn returns the connection the Replicator administers its region's
// stream through (replication.Config.Admin), or nil: with an embedded server
// that lets in only the PoPs' keys, one with this process's in-memory admin
// key; with an embedded server without credentials (in process, or open on
// loopback with --nats-allow-anonymous), the PoP's own connection; with
// external servers, one with --nats-admin-nkey when given.
func (f *replFlags) adminConn(url string, nc *nats.Conn, key nkeys.KeyPair, log *slog.Logger) (*nats.Conn, error) {
	switch {
	case f.natsURL == "" && key != nil:
		c, err := replication.Connect(replication.ConnConfig{URL: url, Name: "edgelimit " + f.pop + " admin", NKey: key,
			Logger: log.With("component", "nats-admin")})
		if err != nil {
			return nil, fmt.Errorf("embedded NATS, admin connection: %w", err)
		}
		return c, nil
	case f.natsURL == "":
		return nc, nil
	case f.natsAdminNKey != "":
		cfg := f.connConfig(url, "edgelimit "+f.pop+" admin", log.With("component", "nats-admin"))
		cfg.User, cfg.Password, cfg.CredsFile, cfg.NKeySeedFile = "", "", "", f.natsAdminNKey
		c, err := replication.Connect(cfg)
		if err != nil {
			return nil, fmt.Errorf("--nats-admin-nkey: %w", err)
		}
		return c, nil
	}
	return nil, nil
}

// connConfig is a NATS connection to url with this PoP's credentials and
// TLS: to its region's servers (--nats) and to other regions' (--nats-direct).
func (f *replFlags) connConfig(url, name string, log *slog.Logger) replication.ConnConfig {
	return replication.ConnConfig{URL: url, Name: name,
		User: f.natsUser, Password: f.natsPass, NKeySeedFile: f.natsNKey, CredsFile: f.natsCreds, CAFile: f.natsCA, CertFile: f.natsCert, KeyFile: f.natsKey,
		Logger: log}
}

// waitCatchUp waits, in the background, until r has caught up on its
// region's stream (Replicator.CaughtUp) or timeout has passed, then calls
// caughtUp once. It returns a readiness check: an error naming how far the
// PoP has read while it waits, nil after. When the wait times out, it logs
// why the PoP serves anyway.
func waitCatchUp(ctx context.Context, r *replication.Replicator, timeout time.Duration, caughtUp func(), log *slog.Logger) func() error {
	var done atomic.Bool
	if timeout == 0 {
		done.Store(true)
		caughtUp()
		return func() error { return nil }
	}
	began := time.Now()
	go func() {
		defer func() { done.Store(true); caughtUp() }()
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-r.CaughtUp():
			applied, target := r.CatchUp()
			log.Info("replication: caught up on the stream", "applied_seq", applied, "target_seq", target,
				"took", time.Since(began).Round(time.Millisecond).String())
		case <-t.C:
			applied, target := r.CatchUp()
			reason := "the stream is read up to applied_seq of target_seq"
			if target == 0 {
				reason = "the stream's consumer has not started (NATS unreachable or slow)"
			}
			log.Warn("replication: serving before catching up on the stream; checks of region and global limits may admit "+
				"what the other PoPs admitted while this one was down", "catchup_timeout", timeout.String(), "why", reason,
				"applied_seq", applied, "target_seq", target)
		case <-ctx.Done():
		}
	}()
	return func() error {
		if done.Load() {
			return nil
		}
		applied, target := r.CatchUp()
		return fmt.Errorf("catching up on the stream: applied sequence %d of %d (waits at most --catchup-timeout %v)", applied, target, timeout)
	}
}

// errorGauge is a gauge that reads 1 while cond returns an error, else 0: a
// condition that also fails /readyz (a full disk, a PoP catching up).
func errorGauge(opts prometheus.GaugeOpts, cond func() error) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(opts, func() float64 {
		if cond() != nil {
			return 1
		}
		return 0
	})
}

// streamMaxBytes is the cap of the region's stream for a JetStream store of
// maxStore bytes: three quarters of it (0, no cap, for 0). The stream then discards its oldest
// messages before the store is full, so a PoP's publishes are never refused
// for a store the stream itself filled; the quarter left covers the file
// store's own overhead (indexes, the messages of a block being discarded)
// and the ephemeral consumers' state.
func streamMaxBytes(maxStore int64) int64 { return maxStore / 4 * 3 }

// messageCap is the largest message a PoP publishes to a stream capped at
// streamMaxBytes(maxStore): an eighth of that cap, so that discarding the
// oldest messages always makes room, or 0 (the server's max payload) when
// that is larger than a payload can be anyway.
func messageCap(maxStore int64) int {
	if c := streamMaxBytes(maxStore) / 8; c > 0 && c < 1<<20 {
		return int(max(c, 4<<10))
	}
	return 0
}

// registerStreamHealth exports what the Replicator knows of its stream and
// the embedded server's leaf links: each also fails /readyz, but the
// stream's size and a link cut by the network.
func registerStreamHealth(reg prometheus.Registerer, r *replication.Replicator, links *replication.LinkWatch) {
	reg.MustRegister(
		errorGauge(prometheus.GaugeOpts{
			Name: "edgelimit_replication_stream_misconfigured",
			Help: "1 while the region's stream is configured otherwise than this PoP expects (subjects, transforms, sources, limits): the PoP does not consume it and /readyz says what differs.",
		}, r.StreamErr),
		errorGauge(prometheus.GaugeOpts{
			Name: "edgelimit_jetstream_store_full",
			Help: "1 while JetStream refuses this PoP's publishes for want of storage (insufficient resources): nothing it counts reaches the other PoPs until one is stored again; /readyz fails.",
		}, r.JetStreamFull),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgelimit_jetstream_stream_bytes", Help: "Bytes the region's stream holds (looked at every few seconds).",
		}, func() float64 { b, _ := r.StreamBytes(); return float64(b) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgelimit_jetstream_stream_max_bytes", Help: "The region's stream's cap (--nats-max-store-mib × 3/4): past it the oldest messages are discarded. 0: none.",
		}, func() float64 { _, m := r.StreamBytes(); return float64(m) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgelimit_nats_leaf_links_down",
			Help: "Leaf links of the embedded NATS server to the hub region (--nats-leaf-remote) that are not up: the region counts alone meanwhile. /readyz fails when the hub refused the link's credential.",
		}, func() float64 { return float64(links.Down()) }),
	)
}

// registerStoreGuard exports the embedded NATS server's JetStream store guard.
func registerStoreGuard(reg prometheus.Registerer, g *replication.StoreGuard) {
	reg.MustRegister(
		errorGauge(prometheus.GaugeOpts{
			Name: "edgelimit_jetstream_disk_full",
			Help: "1 while the embedded NATS server's JetStream store cannot write (free space under --data-min-free-mib, or ENOSPC met): the PoP decides from its own store, /readyz fails, and its counts are published once space returns.",
		}, g.Full),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgelimit_jetstream_restarts_total", Help: "JetStream restarts of the embedded NATS server once space returned after ENOSPC (nats-server writes no more to a stream that met ENOSPC until then).",
		}, func() float64 { return float64(g.Stats().Restarts) }),
	)
}

// replicationCollector exports a Replicator's Stats to Prometheus when scraped.
type replicationCollector struct{ r *replication.Replicator }

var (
	replCounters = []struct {
		name, help string
		get        func(replication.Stats) uint64
	}{
		{"edgelimit_replication_published_batches_total", "Delta batches JetStream acknowledged.", func(s replication.Stats) uint64 { return s.PublishedBatches }},
		{"edgelimit_replication_published_slots_total", "Slots in acknowledged delta batches.", func(s replication.Stats) uint64 { return s.PublishedSlots }},
		{"edgelimit_replication_published_bytes_total", "Payload bytes of acknowledged delta batches.", func(s replication.Stats) uint64 { return s.PublishedBytes }},
		{"edgelimit_replication_publish_failures_total", "Messages whose publish failed or timed out; their slots are retried.", func(s replication.Stats) uint64 { return s.PublishFailures }},
		{"edgelimit_replication_applied_batches_total", "Other PoPs' delta batches applied (from the stream).", func(s replication.Stats) uint64 { return s.AppliedBatches }},
		{"edgelimit_replication_applied_slots_total", "Slots of other PoPs applied from delta batches.", func(s replication.Stats) uint64 { return s.AppliedSlots }},
		{"edgelimit_replication_applied_snapshots_total", "Other PoPs' snapshot messages applied (anti-entropy).", func(s replication.Stats) uint64 { return s.AppliedSnapshots }},
		{"edgelimit_replication_hot_batches_total", "Batches of this PoP's slots of keys near their limit published again on its hot subject, for other regions' direct paths (--nats-direct).", func(s replication.Stats) uint64 { return s.HotBatches }},
		{"edgelimit_replication_direct_batches_total", "Other regions' batches taken straight off their subjects: on the direct path (--nats-direct), and while stream sourcing was stalled.", func(s replication.Stats) uint64 { return s.DirectBatches }},
		{"edgelimit_mitigation_bits_published_total", "Mitigation bits JetStream acknowledged.", func(s replication.Stats) uint64 { return s.PublishedBits }},
		{"edgelimit_mitigation_bits_applied_total", "Other PoPs' mitigation bits applied from batches.", func(s replication.Stats) uint64 { return s.AppliedBits }},
	}
	replDropped  = prometheus.NewDesc("edgelimit_replication_dropped_messages_total", "Stream messages dropped as corrupt or unknown, by reason.", []string{"reason"}, nil)
	replLag      = prometheus.NewDesc("edgelimit_replication_lag_seconds", "Replication lag of applied delta batches (sender's build to receiver's apply), by quantile.", []string{"quantile"}, nil)
	bitLag       = prometheus.NewDesc("edgelimit_mitigation_propagation_seconds", "Mitigation bit propagation delay (issued at another PoP to applied here), by quantile.", []string{"quantile"}, nil)
	replRejected = prometheus.NewDesc("edgelimit_replication_rejected_total",
		"What the receiver refused or clamped as no PoP of the topology could have sent it, by reason: unknown_replica, sender_mismatch, count_bound, bit_end.", []string{"reason"}, nil)
	replStalled = prometheus.NewDesc("edgelimit_replication_stalled_sources", "Other regions whose stream source is stalled.", nil, nil)
	clockOff    = prometheus.NewDesc("edgelimit_clock_offset_seconds", "Correction of this PoP's wall clock to the median clock of the PoPs it hears (--clock-sync); far from 0 means its NTP, or most others', is wrong.", nil, nil)
)

func (c replicationCollector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(c, ch)
}

func (c replicationCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.r.Stats()
	for _, m := range replCounters {
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(m.name, m.help, nil, nil), prometheus.CounterValue, float64(m.get(s)))
	}
	for i, n := range s.Dropped {
		ch <- prometheus.MustNewConstMetric(replDropped, prometheus.CounterValue, float64(n), replication.DropReason(i).String())
	}
	for i, n := range s.Rejected {
		ch <- prometheus.MustNewConstMetric(replRejected, prometheus.CounterValue, float64(n), replication.RejectReason(i).String())
	}
	ch <- prometheus.MustNewConstMetric(replLag, prometheus.GaugeValue, s.Lag.P50.Seconds(), "0.5")
	ch <- prometheus.MustNewConstMetric(replLag, prometheus.GaugeValue, s.Lag.P99.Seconds(), "0.99")
	ch <- prometheus.MustNewConstMetric(replStalled, prometheus.GaugeValue, float64(s.StalledSources))
	ch <- prometheus.MustNewConstMetric(clockOff, prometheus.GaugeValue, s.ClockOffset.Seconds())
	ch <- prometheus.MustNewConstMetric(bitLag, prometheus.GaugeValue, s.BitLag.P50.Seconds(), "0.5")
	ch <- prometheus.MustNewConstMetric(bitLag, prometheus.GaugeValue, s.BitLag.P99.Seconds(), "0.99")
}

// quietWhileFull demotes the replicator's "message not acknowledged"
// warnings to debug while guard says the JetStream store is full: the guard
// has said so once, and every publish fails until space returns.
func quietWhileFull(log *slog.Logger, guard *replication.StoreGuard) *slog.Logger {
	if guard == nil {
		return log
	}
	return slog.New(fullDemoter{log.Handler(), guard})
}

type fullDemoter struct {
	slog.Handler
	guard *replication.StoreGuard
}

func (d fullDemoter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && r.Message == replication.MsgNotAcknowledged && d.guard.Full() != nil {
		r.Level = slog.LevelDebug
	}
	if !d.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return d.Handler.Handle(ctx, r)
}

func (d fullDemoter) WithAttrs(as []slog.Attr) slog.Handler {
	return fullDemoter{d.Handler.WithAttrs(as), d.guard}
}

func (d fullDemoter) WithGroup(name string) slog.Handler {
	return fullDemoter{d.Handler.WithGroup(name), d.guard}
}

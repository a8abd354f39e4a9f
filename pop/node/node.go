// Package node runs a PoP process: it wires the rule watcher, the counter
// store, the decision engine, the metrics and the HTTP API together and serves
// until its context ends. cmd/edgelimit only parses flags into a Config and
// calls Run.
package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/grpcapi"
	"github.com/edgelimit/edgelimit/pop/httpapi"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
	"github.com/edgelimit/edgelimit/pop/topkeys"
	"github.com/edgelimit/edgelimit/region"
)

// Config is a PoP's configuration.
type Config struct {
	// Listen is the HTTP API's address.
	Listen string
	// GRPCListen, when set, is the address of Envoy's gRPC rate limit
	// service and the gRPC health service (grpcapi).
	GRPCListen string
	// GRPCMaxStreams and GRPCMaxConns bound the gRPC service's streams per
	// connection and connections (grpcapi.Config); 0 means grpcapi's
	// defaults. ReadTimeout and MaxBodyMemory bound it too.
	GRPCMaxStreams uint32
	GRPCMaxConns   int
	// Rules are rule files or directories of rule files.
	Rules []string
	// RulesInterval is how often rule files are polled for changes.
	RulesInterval time.Duration
	// AllowEmptyRules lets the PoP start with, or reload to, a rule set
	// without limits, which admits every request. Off, such a load is an
	// error (rules.ErrNoLimits) and the last good rules stay.
	AllowEmptyRules bool
	// MergeDomains lets several rule files define one domain, their
	// descriptors joined (rules.Options.MergeDomains).
	MergeDomains bool
	// BoundedWait is how long a check that bounded limits denied waits for
	// allowance on its way to this PoP (pop.Engine.UseAllowanceWait;
	// pop.DefaultBoundedWait is edgelimit pop's default); 0: it does not
	// wait. Negative is an error.
	BoundedWait time.Duration
	// CountDeniedHits makes pop-scope limits count denied hits, as Envoy's
	// ratelimit does (pop.Engine.SetCountDenied).
	CountDeniedHits bool
	// DefaultAlgorithm counts the limits whose rules name no algorithm
	// (rules.Options.DefaultAlgorithm; the zero value is sliding_window).
	DefaultAlgorithm limit.Algorithm
	// QuotaMode puts every limit in quota mode, as Envoy's ratelimit's
	// QUOTA_MODE (rules.Options.QuotaMode, pop.Engine.SetQuotaMode).
	QuotaMode bool
	// ShadowMode answers OK what a limit denies, counting and reporting it,
	// as Envoy's ratelimit's SHADOW_MODE (pop.Engine.SetShadowMode).
	ShadowMode bool
	// Headers selects the rate limit fields of responses, over HTTP and
	// gRPC; nil means pop.DefaultHeaders.
	Headers *pop.Headers
	// DynamicMetadata returns the request and the rules' metadata in gRPC
	// responses' dynamic_metadata (grpcapi.Config.DynamicMetadata).
	DynamicMetadata bool
	// EnvoyCompat answers malformed gRPC requests and /json as Envoy's
	// ratelimit does (grpcapi.Config.EnvoyCompat).
	EnvoyCompat bool
	// DataDir holds the PoP's durable state; it is created if missing.
	DataDir string
	// Store is "embedded" or a Redis URL (redis://, rediss://, or a
	// comma-separated Cluster seed list).
	Store string
	// RedisPassword, when set, authenticates to Redis instead of the URL's
	// password (cmd reads it from --redis-password-file).
	RedisPassword string
	// StoreHealthInterval is how often a Redis store is pinged to report
	// readiness and log connection or authentication failures; 0 means
	// DefaultStoreHealthInterval.
	StoreHealthInterval time.Duration
	// RedisTimeout is a Redis check's deadline; past it, the check is
	// decided by the embedded store.
	RedisTimeout time.Duration
	// RedisClock is "redis" (window boundaries from Redis TIME, so servers
	// with skewed clocks agree) or "local".
	RedisClock string
	// RedisBatchWindow is how long a Redis pipeline waits for more checks
	// while another is in flight; negative sends at once.
	RedisBatchWindow time.Duration
	// RedisPipelines is how many pipelines may be in flight at once.
	RedisPipelines int
	// RedisDenyCache is how many keys over their limit the Redis store
	// remembers, to deny their checks without Redis
	// (store.RedisConfig.DenyCacheKeys); 0 turns the cache off.
	RedisDenyCache int
	// BreakerFailures and BreakerCooldown tune the circuit breaker in front
	// of Redis: it opens after that many consecutive failures and probes
	// again after the cooldown.
	BreakerFailures int
	BreakerCooldown time.Duration
	// MaxKeys bounds the embedded store.
	MaxKeys int
	// SweepInterval is how often the embedded store drops idle keys.
	SweepInterval time.Duration
	// Replica names this PoP as a CRDT replica and RegionPeers the other PoPs
	// of its region: with them, limits with scope region or global count
	// across PoPs (store.MemoryConfig, store.RedisConfig). Replicas are the
	// other PoPs of every region, whose news the estimate waits for.
	Replica     string
	RegionPeers []string
	Replicas    []string
	// Region is this PoP's region and Topology every region's PoPs: with
	// Replica and Replicate, limits with consistency strong are decided at
	// their key's home PoP (store.Strong), asked over the transport that
	// Replicate hands to ReplicaHooks.Strong. PartitionShare is the share
	// a global limit keeps per reachable region while others are cut off
	// (store.StrongConfig.PartitionShare).
	Region         string
	Topology       region.Topology
	PartitionShare float64
	// Extrapolate makes the embedded store count the hits other PoPs have
	// probably admitted since their last message (store.MemoryConfig).
	Extrapolate bool
	// Replicate, when set, wires the store to replication (cmd supplies it;
	// pop does not import replication). It is called before the PoP serves
	// its first check, so that it can restore durable state into the store,
	// and returns the function that runs replication until ctx ends and a
	// readiness check (/readyz fails while it returns an error: the stream's
	// disk is full, or a restarted PoP has not caught up yet); ready may be
	// nil.
	Replicate func(ctx context.Context, h ReplicaHooks) (run func() error, ready func() error, err error)
	// HoldReplicated makes checks of region and global items wait, with
	// Replicate, until it calls ReplicaHooks.CaughtUp (or the request's
	// context ends): a restarted PoP then decides them on the other PoPs'
	// counts, not on its own alone. Checks of pop-scope items never wait.
	HoldReplicated bool
	// Durable, when set, makes the embedded store's own table durable (cmd
	// supplies it: it opens Pebble under DataDir; pop does not import
	// replication). It is called before the PoP serves its first check and
	// before Replicate, restores the saved states into h.Store, and returns
	// the function that keeps saving them until ctx ends and a readiness
	// check (/readyz fails while it returns an error, e.g. a full disk).
	Durable func(ctx context.Context, h DurableHooks) (run func() error, ready func() error, err error)
	// DebugListen, when set, serves net/http/pprof on that address. Keep it
	// on loopback or a private interface.
	DebugListen string
	// ShutdownTimeout bounds a graceful shutdown: once it has passed, the
	// connections still open are closed.
	ShutdownTimeout time.Duration
	// ReadTimeout bounds the time a client may take to send a request's
	// headers and body, over HTTP and gRPC alike; 0 means
	// DefaultReadTimeout.
	ReadTimeout time.Duration
	// MaxBodyMemory bounds the memory held by request bodies in flight
	// (httpapi.Config.MaxBodyMemory), and apart from it the memory of gRPC
	// streams receiving their requests (grpcapi.Config.ReceiveMemory); 0
	// means httpapi's and grpcapi's defaults.
	MaxBodyMemory int64
	// ClientIPHeader names the header /v1/authz reads a client's address
	// from (httpapi.Config.ClientIPHeader); empty means httpapi's default.
	ClientIPHeader string
	// HideMitigations leaves GET /v1/mitigations out of the API: it lists
	// the keys (possibly API keys) under mitigation to anyone who can reach
	// the port.
	HideMitigations bool
	// TopKeys is the size of the sketch of the most limited keys, served at
	// GET /v1/top (unless HideMitigations) and as edgelimit_top_limited_keys;
	// 0 keeps none.
	TopKeys int
	Logger  *slog.Logger
	// Version names the build on the status page (GET /status).
	Version string
	// Ready, when set, receives the address the API listens on once it does.
	Ready chan<- net.Addr
	// GRPCReady, when set with GRPCListen, receives the address the gRPC
	// service listens on once it does.
	GRPCReady chan<- net.Addr
	// QuotaConfig configures tenant quotas and the admin API (quotas.go).
	QuotaConfig
}

// DefaultReadTimeout is Config.ReadTimeout's default: how long a client may
// take to send a request, headers and body.
const DefaultReadTimeout = 10 * time.Second

// Counts is a counter store as replication sees it (replication.Counts,
// declared here because pop does not import replication): the embedded store
// and the Redis store both implement it.
type Counts interface {
	Delta() []crdt.Slot
	Own() []crdt.Slot
	Restore(own []crdt.Slot)
	Apply(sent int64, remote []crdt.Slot)
	Remote() []crdt.Slot
}

// ReplicaHooks is what the node hands to Config.Replicate.
type ReplicaHooks struct {
	// Counts is the store's replicated counts; Bits the mitigation table.
	Counts Counts
	Bits   Bits
	// Registerer takes replication's metrics.
	Registerer prometheus.Registerer
	// SetGlobalShare scales global limits while the region is cut off
	// (pop.Engine.SetGlobalShare).
	SetGlobalShare func(float64)
	// Bounds is what other PoPs can honestly send, from the rules in force
	// (pop.Engine.ReplicaBounds), for replication's receiver checks.
	Bounds pop.ReplicaBounds
	// SetClockOffset moves the clock the PoP decides on by the correction
	// the PoPs agreed on (pop.Engine.SetClockOffset, and the store's).
	SetClockOffset func(time.Duration)
	// Strong, when set, is this PoP's store of strong limits: Replicate
	// answers the other PoPs' requests with its AnswerAt, at Now, and hands
	// it the transport to ask theirs (SetAsker).
	Strong *store.Strong
	// Now is the clock the PoP decides on (pop.Engine.Now).
	Now func() time.Time
	// CaughtUp is called once the PoP has applied what the other PoPs
	// published while it was down, or has stopped waiting for it: with
	// Config.HoldReplicated, checks of region and global items wait until
	// then. Calling it again does nothing.
	CaughtUp func()
	// ReportStatus hands the node what Replicate reports of replication for
	// the status page: NATS, the other PoPs heard, the regions cut off. The
	// node fills in GlobalShare. It is called at most once, from Replicate.
	ReportStatus func(func() httpapi.ReplicationStatus)
}

// DurableHooks is what the node hands to Config.Durable.
type DurableHooks struct {
	// Store is the embedded store (with a Redis store, its fallback), made
	// with MemoryConfig.Durable.
	Store *store.Memory
	// Registerer takes the durable state's metrics.
	Registerer prometheus.Registerer
}

// Bits is a PoP's mitigation table as replication sees it (replication.Bits).
type Bits interface {
	BitsDelta() []crdt.Bit
	ApplyBits(bits []crdt.Bit)
}

// Run serves a PoP until ctx ends, then shuts down gracefully. The rules must
// load at start; later reloads that fail keep the last good rules.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if len(cfg.Rules) == 0 {
		return errors.New("no rule files: give --rules a file or a directory (see deploy/examples/rules.yaml)")
	}
	ruleOpts := rules.Options{MergeDomains: cfg.MergeDomains, DefaultAlgorithm: cfg.DefaultAlgorithm, QuotaMode: cfg.QuotaMode}
	set, warns, err := rules.LoadWith(ruleOpts, cfg.Rules...)
	if err != nil {
		return fmt.Errorf("rules: %w", err)
	}
	for _, w := range warns {
		log.Warn("rules: " + w.String())
	}
	if !cfg.AllowEmptyRules {
		if err := rules.CheckNotEmpty(set); err != nil {
			return fmt.Errorf("%w (pass --allow-empty-rules if that is intended)", err)
		}
	}
	if err := cfg.checkStore(set); err != nil {
		return err
	}
	if cfg.DataDir != "" {
		if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
	}

	// Listen first: a busy address fails before anything else starts.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	var grpcLn net.Listener
	if cfg.GRPCListen != "" {
		if grpcLn, err = net.Listen("tcp", cfg.GRPCListen); err != nil {
			return fmt.Errorf("grpc listen: %w", err)
		}
		defer grpcLn.Close()
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	statusReg := prometheus.NewRegistry() // pop.Metrics alone, for the status page's samples
	metrics := pop.NewMetrics(teeRegisterer{reg, statusReg})

	st, mem, counts, ping, closeStore, err := openStore(cfg, reg)
	if err != nil {
		return err
	}
	defer closeStore()
	health := &storeHealth{ping: ping, log: log}
	if ping != nil {
		// Probe once before serving, so that a wrong password or an
		// unreachable server is in the log (and in /readyz) from the start.
		health.probe(time.Now())
		interval := cfg.StoreHealthInterval
		if interval <= 0 {
			interval = DefaultStoreHealthInterval
		}
		stop := make(chan struct{})
		defer close(stop)
		go every(interval, stop, func(now int64) { health.probe(time.Unix(0, now)) })
	}

	status := &statusSource{cfg: &cfg, started: time.Now(), listen: ln.Addr().String(), mem: mem, health: health, metrics: statusReg}
	status.fb, _ = st.(*store.Fallback)
	status.loaded(set, status.started, false)

	strongStore, err := openStrong(cfg, st, reg)
	if err != nil {
		return err
	}
	if strongStore != nil {
		st = strongStore
	}
	var hold *holdStore
	if cfg.Replicate != nil && cfg.HoldReplicated {
		hold = newHoldStore(st)
		st = hold
		defer hold.release() // whatever happens, nothing waits past Run
	}
	eng := pop.NewEngine(st, set, metrics)
	if strongStore != nil {
		strongStore.UseGlobalShare(eng.GlobalShare) // a home decides at the share its engine holds
	}
	if cfg.BoundedWait > 0 && mem != nil {
		eng.UseAllowanceWait(mem, cfg.BoundedWait)
	}
	eng.SetCountDenied(cfg.CountDeniedHits)
	eng.SetQuotaMode(cfg.QuotaMode)
	eng.SetShadowMode(cfg.ShadowMode)
	eng.SetOverrideAlgorithm(cfg.DefaultAlgorithm)
	var top *topkeys.Sketch
	if cfg.TopKeys > 0 {
		top = topkeys.New(cfg.TopKeys)
		eng.UseTopKeys(top)
		reg.MustRegister(top.Collector(TopKeysMetric, rules.DescribeKey))
	}
	eng.UseLeases(leaserFor(counts))
	var mit *pop.Mitigations
	if cfg.Replica != "" {
		mit = pop.NewMitigations(cfg.Replica)
		eng.UseMitigations(mit)
		registerMitigations(reg, mit)
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgelimit_global_share",
			Help: "The share of every global limit this PoP enforces: 1, or less while its region is cut off from others.",
		}, eng.GlobalShare))
		go every(time.Second, ctx.Done(), func(now int64) { mit.Sweep(now) })
	}
	warned := map[string]bool{} // the limits warnScopes has named: each once
	if cfg.Replica == "" {
		warnScopes(log, set, warned)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := health.ready
	durableDone := make(chan struct{})
	if cfg.Durable != nil {
		run, durableReady, err := cfg.Durable(ctx, DurableHooks{Store: mem, Registerer: reg})
		if err != nil {
			return fmt.Errorf("durable state: %w", err)
		}
		go func() {
			defer close(durableDone)
			if err := run(); err != nil {
				log.Error("durable state stopped", "err", err)
			}
		}()
		// Wait for the last save before returning, after the servers stop.
		defer func() { cancel(); <-durableDone }()
		ready = func() error {
			if err := health.ready(); err != nil {
				return err
			}
			if err := durableReady(); err != nil {
				return fmt.Errorf("durable state: %w", err)
			}
			return nil
		}
	}
	stopQuotas, adminErr, err := startQuotas(ctx, cfg, eng, reg, log)
	if err != nil {
		return err
	}
	defer stopQuotas()
	replErr := make(chan error, 1)
	if cfg.Replicate != nil {
		setClock := func(d time.Duration) {
			eng.SetClockOffset(d)
			if c, ok := counts.(interface{ SetClockOffset(time.Duration) }); ok {
				c.SetClockOffset(d)
			}
			if strongStore != nil {
				if err := strongStore.SetClockOffset(ctx, d); err != nil {
					log.Warn("consistency strong: the clock stepped, and the home counters could not count the hits it moved into the current window", "err", err)
				}
			}
		}
		run, replReady, err := cfg.Replicate(ctx, ReplicaHooks{Counts: counts, Bits: mit, Registerer: reg, SetGlobalShare: eng.SetGlobalShare, SetClockOffset: setClock,
			Strong: strongStore, Now: eng.Now,
			ReportStatus: func(f func() httpapi.ReplicationStatus) { status.repl.Store(&f) },
			Bounds:       eng.ReplicaBounds(), CaughtUp: func() {
				if hold != nil {
					hold.release()
				}
			}})
		if err != nil {
			return fmt.Errorf("replication: %w", err)
		}
		go func() { replErr <- run() }()
		if replReady != nil {
			storeReady := ready
			ready = func() error {
				if err := storeReady(); err != nil {
					return err
				}
				if err := replReady(); err != nil {
					// The replication package's errors name it already.
					if strings.HasPrefix(err.Error(), "replication:") {
						return err
					}
					return fmt.Errorf("replication: %w", err)
				}
				return nil
			}
		}
	}
	// The watcher's first look loads the files again (the same rules, unless
	// they changed since the load above) and swaps them in.
	watcher := rules.NewWatcher(cfg.Rules, cfg.RulesInterval, log)
	watcher.AllowEmpty = cfg.AllowEmptyRules
	watcher.Options = ruleOpts
	watcher.Check = cfg.checkStore
	go watcher.Run(ctx,
		func(s *rules.Set, warns []rules.Warning) {
			for _, w := range warns {
				log.Warn("rules: " + w.String())
			}
			if cfg.Replica == "" {
				warnScopes(log, s, warned)
			}
			eng.SetRules(s)
			status.loaded(s, time.Now(), true)
		},
		func(err error) {
			metrics.RulesFailed()
			status.failed(err, time.Now())
			log.Error("rules reload failed; the last good rules stay in force", "err", err)
		})

	api := httpapi.New(httpapi.Config{
		Engine:          eng,
		Mitigations:     mit,
		TopKeys:         top,
		Metrics:         metrics,
		MetricsHandler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
		Ready:           ready,
		Status:          func() *httpapi.Status { return status.status(time.Now()) },
		MaxBodyMemory:   cfg.MaxBodyMemory,
		ClientIPHeader:  cfg.ClientIPHeader,
		HideMitigations: cfg.HideMitigations,
		DecodeProto:     grpcapi.DecodeJSON,
		Headers:         cfg.Headers,
		Logger:          log,
	})
	// /json beside /v1/check: Envoy's ratelimit's own JSON endpoint.
	mux := http.NewServeMux()
	mux.Handle("/json", grpcapi.NewJSONHandler(grpcapi.Config{Engine: eng, Metrics: metrics, Logger: log,
		Headers: cfg.Headers, DynamicMetadata: cfg.DynamicMetadata, EnvoyCompat: cfg.EnvoyCompat}))
	mux.Handle("/", api)
	readTimeout := cfg.ReadTimeout
	if readTimeout <= 0 {
		readTimeout = DefaultReadTimeout
	}
	srv := &http.Server{
		Handler: mux,
		// ReadTimeout covers a request's headers and body: a client that
		// trickles its body is cut off (408) instead of holding a handler.
		ReadTimeout:       readTimeout,
		ReadHeaderTimeout: min(5*time.Second, readTimeout),
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	status.eng, status.mit, status.ready = eng, mit, ready
	go every(trafficSampleEvery, ctx.Done(), func(now int64) { status.sample(time.Unix(0, now), true) })
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("PoP serving", "listen", ln.Addr().String(), "store", storeName(cfg.Store), "data", cfg.DataDir)
	if cfg.Ready != nil {
		cfg.Ready <- ln.Addr()
	}

	var gsrv *grpcapi.Server
	if grpcLn != nil {
		gsrv = grpcapi.New(grpcapi.Config{
			Engine: eng, Metrics: metrics, Requests: grpcapi.NewRequestCounter(reg), Logger: log,
			MaxStreams: cfg.GRPCMaxStreams, MaxConns: cfg.GRPCMaxConns, ReadTimeout: readTimeout, ReceiveMemory: cfg.MaxBodyMemory,
			Headers: cfg.Headers, DynamicMetadata: cfg.DynamicMetadata, EnvoyCompat: cfg.EnvoyCompat,
		})
		// The rules loaded before serving; the health service follows the
		// store's readiness, as /readyz does.
		gsrv.SetServing(ready() == nil)
		if ping != nil || cfg.Durable != nil || cfg.Replicate != nil {
			stop := make(chan struct{})
			defer close(stop)
			go every(time.Second, stop, func(int64) { gsrv.SetServing(ready() == nil) })
		}
		go func() { errc <- gsrv.Serve(grpcLn) }()
		log.Info("gRPC rate limit service serving", "listen", grpcLn.Addr().String())
		if cfg.GRPCReady != nil {
			cfg.GRPCReady <- grpcLn.Addr()
		}
	}

	if cfg.DebugListen != "" {
		dbg := &http.Server{Addr: cfg.DebugListen, Handler: debugMux(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := dbg.ListenAndServe(); err != nil && err != http.ErrServerClosed {
				log.Error("debug listener failed", "err", err)
			}
		}()
		defer dbg.Close()
		log.Info("pprof serving", "listen", cfg.DebugListen)
	}

	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case err := <-replErr:
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("replication: %w", err)
		}
	case err := <-adminErr:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, scancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer scancel()
	grpcStopped := make(chan struct{})
	if gsrv != nil {
		// NOT_SERVING first, then the calls in flight finish: both APIs
		// within the one shutdown timeout.
		go func() { gsrv.Stop(sctx); close(grpcStopped) }()
	} else {
		close(grpcStopped)
	}
	defer func() { <-grpcStopped }()
	if err := srv.Shutdown(sctx); err != nil {
		// Requests still running (or clients still sending) after the
		// timeout: close their connections rather than wait on them.
		log.Warn("shutdown timeout passed; closing the connections still open", "timeout", cfg.ShutdownTimeout.String(), "err", err)
		_ = srv.Close()
	}
	return nil
}

// storeName is the --store setting as logs show it: without passwords.
func storeName(s string) string {
	if s == "" {
		return "embedded"
	}
	return store.RedactURL(s)
}

// openStore builds the counter store the configuration names and registers
// its metrics. A Redis store always sits behind a circuit breaker that falls
// back to an embedded store, so a PoP keeps limiting on local knowledge when
// Redis fails.
//
// With a replica name, the store that decides also replicates: the embedded
// store, or Redis — whose fallback store then decides region and global
// limits on the Redis store's in-process counts while Redis is unreachable
// (store.MemoryConfig.Primary).
//
// ping, nil for the embedded store, asks Redis whether it answers and accepts
// the credentials.
func openStore(cfg Config, reg prometheus.Registerer) (st pop.Store, mem *store.Memory, counts Counts, ping func(context.Context) error, closeStore func(), err error) {
	embedded := cfg.Store == "" || cfg.Store == "embedded"
	memCfg := store.MemoryConfig{MaxKeys: cfg.MaxKeys, Durable: cfg.Durable != nil}
	// The estimate's misses, from whichever store makes the estimate.
	var estimateMiss, settledExcess func(limit.Scope, float64)
	if cfg.Extrapolate && cfg.Replica != "" {
		miss := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "edgelimit_estimate_error_hits",
			Help: "How far this PoP's estimate of another PoP's count of a key it admits near its limit (heard plus guessed since) " +
				"was from the count that PoP then reported, in hits, by scope: positive overestimated (denied early), negative underestimated (overshoot).",
			Buckets: []float64{-50, -20, -10, -5, -2, -1, -0.5, 0.5, 1, 2, 5, 10, 20, 50},
		}, []string{"scope"})
		reg.MustRegister(miss)
		estimateMiss = func(scope limit.Scope, hits float64) { miss.WithLabelValues(scope.String()).Observe(hits) }
		over := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "edgelimit_settled_excess_percent",
			Help: "For each window in which this PoP found a region or global sliding-window key at its limit: how far over the limit " +
				"all PoPs together admitted in it, once every PoP's count of it arrived, in percent of the limit, by scope (negative: under).",
			Buckets: []float64{-20, -10, -5, -2, -1, 0, 1, 2, 5, 10, 20, 50, 100},
		}, []string{"scope"})
		reg.MustRegister(over)
		for _, sc := range []limit.Scope{limit.ScopeRegion, limit.ScopeGlobal} {
			over.WithLabelValues(sc.String()) // exported from the start, at 0: alerts and dashboards find it
		}
		settledExcess = func(scope limit.Scope, pct float64) { over.WithLabelValues(scope.String()).Observe(pct) }
	}
	var rs *store.Redis
	if embedded {
		memCfg.Replica, memCfg.RegionPeers, memCfg.Replicas, memCfg.Extrapolate = cfg.Replica, cfg.RegionPeers, cfg.Replicas, cfg.Extrapolate
		memCfg.Incarnation = incarnation(cfg.DataDir, time.Now())
		memCfg.EstimateMiss, memCfg.SettledExcess = estimateMiss, settledExcess
	} else {
		clock, err := store.ParseClockSource(cfg.RedisClock)
		if err != nil {
			return nil, nil, nil, nil, nil, fmt.Errorf("--redis-clock: %w", err)
		}
		rs, err = store.OpenRedis(store.RedisConfig{URL: cfg.Store, Password: cfg.RedisPassword, Timeout: cfg.RedisTimeout, ClockSource: clock,
			BatchWindow: cfg.RedisBatchWindow, Pipelines: cfg.RedisPipelines, DenyCacheKeys: denyCacheKeys(cfg.RedisDenyCache), Replica: cfg.Replica, RegionPeers: cfg.RegionPeers,
			Replicas: cfg.Replicas, Extrapolate: cfg.Extrapolate, EstimateMiss: estimateMiss, SettledExcess: settledExcess})
		if err != nil {
			return nil, nil, nil, nil, nil, fmt.Errorf("store: %w", err)
		}
		// The fallback decides region and global limits on the Redis
		// store's counts of them (store.MemoryConfig.Primary).
		memCfg.Primary = rs
	}
	mem = store.NewMemory(memCfg)
	registerMemory(reg, mem)
	stop := make(chan struct{})
	sweepEvery := cfg.SweepInterval
	if sweepEvery <= 0 {
		sweepEvery = 10 * time.Second
	}
	go every(sweepEvery, stop, func(now int64) { mem.SweepAt(now) })
	if embedded {
		return mem, mem, mem, nil, func() { close(stop) }, nil
	}
	fb := store.NewFallback(rs, mem, store.FallbackConfig{Failures: cfg.BreakerFailures, Cooldown: cfg.BreakerCooldown})
	registerFallback(reg, fb)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "edgelimit_store_redis_local_denials_total",
		Help: "Checks denied from the Redis store's local cache of keys over their limit, without a round trip to Redis (--redis-deny-cache); they count as denials everywhere else too.",
	}, func() float64 { return float64(rs.LocalDenials()) }))
	if cfg.Replica != "" {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgelimit_store_redis_lost_restores_total",
			Help: "Times this server found Redis holding less of the PoP's own replicated counts than it had held (Redis restarted empty or from an older snapshot) and put them back, with the other PoPs' counts it held.",
		}, func() float64 { return float64(rs.LostRestores()) }))
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgelimit_store_redis_offline_denials_total",
			Help: "Checks of region or global limits Redis admitted that this server denied: hits it counted while Redis was away were not in Redis yet, and its own counts had no room.",
		}, func() float64 { return float64(rs.OfflineDenials()) }))
	}
	return fb, mem, rs, rs.Ping, func() { close(stop); _ = rs.Close() }, nil
}

// denyCacheKeys is store.RedisConfig.DenyCacheKeys for Config.RedisDenyCache.
func denyCacheKeys(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}

func registerFallback(reg prometheus.Registerer, fb *store.Fallback) {
	counter := func(name, help string, f func(store.FallbackStats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(fb.Stats())) })
	}
	reg.MustRegister(
		counter("edgelimit_store_errors_total", "Redis calls that failed or timed out; each check was answered by the fallback.",
			func(s store.FallbackStats) uint64 { return s.PrimaryErrors }),
		counter("edgelimit_store_fallback_decisions_total", "Checks decided without Redis: by the embedded store, or denied by a fail_closed limit.",
			func(s store.FallbackStats) uint64 { return s.FallbackDecisions }),
		counter("edgelimit_store_fail_closed_denials_total", "Checks denied because a fail_closed limit could not reach Redis.",
			func(s store.FallbackStats) uint64 { return s.FailClosedDenials }),
		counter("edgelimit_store_breaker_opens_total", "Times the circuit breaker in front of Redis opened.",
			func(s store.FallbackStats) uint64 { return s.BreakerOpens }),
		counter("edgelimit_store_reconciled_hits_total", "Hits given back to Redis because this server knew of more than Redis reported: admitted while Redis was away, or lost when it restarted empty.",
			func(s store.FallbackStats) uint64 { return s.ReconciledHits }),
		counter("edgelimit_store_reconcile_denials_total", "Checks Redis allowed that this server's own counts denied (Redis had lost counts).",
			func(s store.FallbackStats) uint64 { return s.ReconcileDenials }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgelimit_store_breaker_state",
			Help: "The circuit breaker in front of Redis: 0 closed (Redis decides), 1 open (the embedded store decides), 2 half-open (probing).",
		}, func() float64 { return float64(fb.BreakerState()) }),
	)
}

// every calls f with the time every interval until stop is closed.
func every(interval time.Duration, stop <-chan struct{}, f func(now int64)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			f(now.UnixNano())
		}
	}
}

func registerMemory(reg prometheus.Registerer, mem *store.Memory) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgelimit_store_keys",
			Help: "Keys held by the embedded store (active keys; with --store redis, the fallback's).",
		}, func() float64 { return float64(mem.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "edgelimit_store_evictions_total",
			Help:        "Keys the embedded store evicted to stay within --max-keys: idle ones cost no accuracy; live ones restarted from zero.",
			ConstLabels: prometheus.Labels{"kind": "idle"},
		}, func() float64 { return float64(mem.Stats().EvictedIdle) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "edgelimit_store_evictions_total",
			Help:        "Keys the embedded store evicted to stay within --max-keys: idle ones cost no accuracy; live ones restarted from zero.",
			ConstLabels: prometheus.Labels{"kind": "live"},
		}, func() float64 { return float64(mem.Stats().EvictedLive) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgelimit_store_untracked_total",
			Help: "Checks of new keys the embedded store decided on a fresh state and did not keep: it was full of keys still counting that are looked up at least as often.",
		}, func() float64 { return float64(mem.Stats().Untracked) }),
	)
}

// incarnation is store.MemoryConfig.Incarnation for a PoP started at now
// with data directory dir: now, unless dir holds no saved state yet (the
// durable state's "state" directory, see cmd/edgelimit): a PoP that never
// saved anything never admitted anything before this process, so no window
// began before its incarnation, and a new deployment's PoPs start every
// bounded window with their shares rather than none. A PoP whose disk was
// lost counts as new: that is the operator's to avoid (see docs/durability.md).
func incarnation(dir string, now time.Time) int64 {
	if dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "state")); errors.Is(err, fs.ErrNotExist) {
			return 0
		}
	}
	return now.UnixNano()
}

// checkStore refuses rules the PoP's store cannot serve: a limit with
// consistency bounded is decided by the embedded store's allowance ledgers
// (store/bounded.go), which a PoP on Redis does not have yet.
func (cfg *Config) checkStore(set *rules.Set) error {
	if cfg.Store == "" || cfg.Store == "embedded" || cfg.Replica == "" {
		return nil
	}
	for _, l := range set.Limits() {
		if l.Consistency == limit.Bounded {
			return fmt.Errorf("rules: limit %q of domain %q has consistency bounded, which a PoP on a Redis store (--store) "+
				"cannot serve yet: run this PoP on the embedded store, or make the limit eventual", l.Name, l.Domain)
		}
	}
	return nil
}

// warnScopes says plainly that region and global limits count this PoP alone
// while it has no replication: once for each limit, named by domain and name,
// that warned does not hold yet (a reload of the same rules says nothing new).
// It records those it names in warned; callers run it one at a time.
func warnScopes(log *slog.Logger, set *rules.Set, warned map[string]bool) {
	for _, l := range set.Limits() {
		if id := l.Domain + "\x00" + l.Name; l.Scope != rules.ScopePOP && !warned[id] {
			warned[id] = true
			log.Warn("limit has scope "+l.Scope.String()+" but this PoP does not replicate yet: it counts this PoP's hits only",
				"domain", l.Domain, "limit", l.Name)
		}
	}
}

func debugMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

func registerMitigations(reg prometheus.Registerer, m *pop.Mitigations) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgelimit_mitigation_bits_issued_total",
			Help: "Mitigation bits this PoP issued or extended (a key found over a region or global limit).",
		}, func() float64 { return float64(m.Stats().Issued) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edgelimit_mitigation_bits_received_total",
			Help: "Other PoPs' mitigation bits that changed this PoP's table.",
		}, func() float64 { return float64(m.Stats().Applied) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgelimit_mitigation_bits_active",
			Help: "Mitigation bits in force.",
		}, func() float64 { return float64(len(m.Active(time.Now().UnixNano()))) }),
	)
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/grpcapi"
	"github.com/edgelimit/edgelimit/pop/httpapi"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/node"
	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/store"
	"github.com/edgelimit/edgelimit/replication"
)

const popUsage = `Usage: edgelimit pop [flags]

Runs a point of presence: it answers rate limit checks over HTTP
(POST /v1/check, POST /v1/check/batch, POST /json as Envoy's ratelimit serves it,
/v1/authz for proxies' forward auth, POST /v1/release for the leases of
concurrency limits), deciding on a counter store and the rules in --rules,
which it reloads when they change, and serves GET / (its status page, for a
browser), /healthz, /readyz and /metrics. Concurrency leases live in the same
store: this process when embedded, the shared Redis with --store redis://….
Tenants' tiers and per-key overrides come from --quotas and are managed on
--admin-listen.

Every flag can also be set by the environment variable EDGELIMIT_<FLAG>
(upper case, '-' as '_', e.g. EDGELIMIT_LISTEN) or by a YAML file given with
--config whose keys are the flag names. The command line wins over the
environment, which wins over the file.

Flags:
`

func runPop(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("pop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg    node.Config
		rules  listFlag
		config string
		level  string
		format string
		repl   replFlags

		redisPasswordFile   string
		adminTokenFile      string
		bodyMemoryMiB       int
		mitigationsEndpoint bool
		minFreeMiB          int64
		grpcMaxStreams      uint

		envoyCompat      bool
		defaultAlgorithm string
		headers          string
		envoyNames       [3]string
	)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8080", "address of the HTTP API")
	fs.StringVar(&cfg.GRPCListen, "grpc-listen", "", "`address` of Envoy's gRPC rate limit service (envoy.service.ratelimit.v3) and the gRPC health service (off when empty)")
	fs.UintVar(&grpcMaxStreams, "grpc-max-streams", grpcapi.DefaultMaxStreams, "streams a gRPC connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS)")
	fs.IntVar(&cfg.GRPCMaxConns, "grpc-max-conns", grpcapi.DefaultMaxConns, "gRPC connections open at once; one past it is closed at once (--read-timeout and\n--max-body-memory-mib bound gRPC requests too)")
	fs.Var(&rules, "rules", "rule `files or directories` (comma-separated or repeated); YAML in Envoy ratelimit's format")
	fs.DurationVar(&cfg.RulesInterval, "rules-interval", time.Second, "how often to read the rule files in full, a backstop: their metadata (size, modification time)\nis looked at every 50ms, and a change there reloads them at once")
	fs.BoolVar(&cfg.CountDeniedHits, "count-denied-hits", false, "pop-scope limits count the hits of denied requests too, as Envoy's ratelimit does (a client that\nkeeps sending stays over); by default a denied request spends no quota")
	fs.BoolVar(&cfg.MergeDomains, "merge-domains", false, "let several rule files define one domain and join their descriptors (Envoy ratelimit's\nMERGE_DOMAIN_CONFIG); without it a domain defined twice is an error")
	fs.BoolVar(&envoyCompat, "envoy-compat", false, "answer as Envoy's ratelimit does (docs/envoy-parity.md): fixed_window as the default algorithm, denied hits\ncounted, no rate limit headers unless LIMIT_RESPONSE_HEADERS_ENABLED, empty rule sets accepted, gRPC's Unknown for a\nbad request; and read the peer's LIMIT_RESPONSE_HEADERS_ENABLED, LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER,\nLIMIT_RESET_HEADER, SHADOW_MODE, QUOTA_MODE, RESPONSE_DYNAMIC_METADATA, MERGE_DOMAIN_CONFIG and\nSTOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT. Flags set explicitly win")
	fs.StringVar(&defaultAlgorithm, "default-algorithm", "sliding_window", "`algorithm` of the limits whose rules name none: sliding_window, fixed_window, token_bucket, gcra or sliding_log")
	fs.StringVar(&headers, "headers", "edgelimit", "rate limit `fields` of responses, HTTP and gRPC: a comma-separated list of x-ratelimit (X-RateLimit-Limit,\n-Remaining, -Reset), ietf (RateLimit-Policy, RateLimit), retry-after, envoy (Envoy's ratelimit's RateLimit-Limit,\n-Remaining, -Reset in seconds), edgelimit (the first three), or none")
	fs.StringVar(&envoyNames[0], "envoy-header-limit", pop.DefaultEnvoyHeaderNames[0], "name of the envoy set's limit field (LIMIT_LIMIT_HEADER)")
	fs.StringVar(&envoyNames[1], "envoy-header-remaining", pop.DefaultEnvoyHeaderNames[1], "name of the envoy set's remaining field (LIMIT_REMAINING_HEADER)")
	fs.StringVar(&envoyNames[2], "envoy-header-reset", pop.DefaultEnvoyHeaderNames[2], "name of the envoy set's reset field, seconds until the window resets (LIMIT_RESET_HEADER)")
	fs.BoolVar(&cfg.ShadowMode, "shadow-mode", false, "answer OK to every request a limit denies, with the statuses still OVER_LIMIT, counted in\nedgelimit_shadow_mode_answers_total (Envoy's ratelimit's SHADOW_MODE)")
	fs.BoolVar(&cfg.QuotaMode, "quota-mode", false, "every limit in quota mode: a request is over only when all its descriptors are (QUOTA_MODE)")
	fs.BoolVar(&cfg.DynamicMetadata, "response-dynamic-metadata", false, "return the domain, the descriptors and the rules' metadata in gRPC responses' dynamic_metadata\n(RESPONSE_DYNAMIC_METADATA)")
	fs.BoolVar(&cfg.AllowEmptyRules, "allow-empty-rules", false, "accept a rule set without limits (it admits every request); without it, an empty rule set\nfails to start and a reload to one fails and keeps the last good rules")
	fs.StringVar(&cfg.DataDir, "data", "./data", "data `directory` for the PoP's durable state (created if missing)")
	fs.Int64Var(&minFreeMiB, "data-min-free-mib", replication.DefaultMinFree>>20, "free space (MiB) the PoP leaves on the --data disk: below it, it stops saving, keeps deciding\nfrom memory, fails /readyz, and saves again once this plus a 16 MiB ballast are free")
	fs.StringVar(&cfg.Store, "store", "embedded", "counter store: embedded (in-process), or a Redis `URL` shared by the PoP's servers:\nredis://[user:pass@]host:port[/db], rediss:// for TLS, or host:port,host:port,... for a Redis Cluster")
	fs.StringVar(&redisPasswordFile, "redis-password-file", "", "`file` holding the Redis password (one line; it replaces a password in --store's URL,\nand keeps it out of the command line and the environment)")
	fs.DurationVar(&cfg.RedisTimeout, "redis-timeout", 5*time.Millisecond, "deadline of a Redis check; past it the embedded store decides")
	fs.DurationVar(&cfg.RedisBatchWindow, "redis-batch-window", store.DefaultBatchWindow, "how long a Redis pipeline waits for more checks while another is in flight (negative: send at once)")
	fs.IntVar(&cfg.RedisPipelines, "redis-pipelines", store.DefaultPipelines, "Redis pipelines in flight at once, each on its own connection")
	fs.IntVar(&cfg.RedisDenyCache, "redis-deny-cache", store.DefaultDenyCacheKeys, "keys over their limit the Redis store remembers, 24 bytes each, to deny their checks without a round\ntrip until they could have room again (docs/performance-redis.md); 0 turns the cache off")
	fs.StringVar(&cfg.RedisClock, "redis-clock", "redis", "whose clock sets window boundaries: redis (Redis TIME, so skewed servers agree) or local")
	fs.IntVar(&cfg.BreakerFailures, "breaker-failures", 5, "consecutive Redis failures that open the circuit breaker")
	fs.DurationVar(&cfg.BreakerCooldown, "breaker-cooldown", time.Second, "how long the open breaker waits before probing Redis again")
	fs.IntVar(&cfg.MaxKeys, "max-keys", store.DefaultMaxKeys, "most keys the embedded store holds (about 150 bytes each); idle keys go first")
	fs.StringVar(&cfg.DebugListen, "debug-listen", "", "`address` for net/http/pprof (off when empty; keep it private)")
	var gcPercent int
	fs.IntVar(&gcPercent, "gc-percent", defaultGCPercent, "garbage collection target, as Go's GOGC (which wins when set): a higher one collects less often, which\nshortens the tail of a steady rate on busy cores, for up to (1 + it/100) × the live heap in memory; 0 is Go's, 100")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long a graceful shutdown may take; then open connections are closed")
	fs.DurationVar(&cfg.ReadTimeout, "read-timeout", node.DefaultReadTimeout, "how long a client may take to send a request, headers and body (408 past it); a gRPC stream\nthat has not sent its request by then is cancelled")
	fs.IntVar(&bodyMemoryMiB, "max-body-memory-mib", httpapi.DefaultMaxBodyMemory>>20, "MiB that request bodies in flight may hold together (503 with Retry-After past it); at least 24,\nwhat the largest batch needs. gRPC streams receiving their requests have a budget of the same size\n(160 KiB a stream; RESOURCE_EXHAUSTED past it)")
	fs.StringVar(&cfg.ClientIPHeader, "client-ip-header", httpapi.DefaultClientIPHeader, "`header` /v1/authz reads a client's address from (client_ip in forward_auth rules): its last address,\nthe one your proxy appended or wrote; without it, the peer's. Name only a header your proxy writes:\nX-Forwarded-For (nginx, Caddy, Traefik and Envoy as deploy/examples configure them), or X-Real-IP\nbehind a proxy that overwrites it (Caddy passes a client's own)")
	fs.BoolVar(&mitigationsEndpoint, "mitigations-endpoint", true, "serve GET /v1/mitigations, which lists the keys under mitigation (possibly API keys)\nto anyone who can reach --listen")
	fs.IntVar(&cfg.TopKeys, "top-keys", node.DefaultTopKeys, "size of the fixed-memory sketch of the most limited keys (GET /v1/top, unless\n--mitigations-endpoint=false; metric edgelimit_top_limited_keys); 0 keeps none")
	fs.StringVar(&repl.region, "region", "", "this PoP's region; with --pop, limits with scope region or global count across PoPs")
	fs.StringVar(&repl.pop, "pop", "", "this PoP's name, its replica name: unique across regions")
	fs.StringVar(&repl.topology, "topology", "", "every region's PoPs: `region=pop,pop;region=pop` (default: this PoP alone)")
	fs.DurationVar(&repl.flush, "flush-interval", 100*time.Millisecond, "how often the PoP saves what it counted to --data and publishes it to the other PoPs:\na kill -9 loses at most the hits admitted in the last interval")
	fs.DurationVar(&repl.urgent, "urgent-interval", 10*time.Millisecond, "least time between two publications of urgent news — a new mitigation bit, or an admission of a region or global limit — which do not wait for the flush; lower it for tighter global limits at the price of more messages")
	fs.DurationVar(&repl.snapshot, "snapshot-interval", 5*time.Second, "how often the PoP republishes all it counts (anti-entropy); raise it with hundreds of thousands of keys")
	fs.DurationVar(&repl.unreachableAfter, "unreachable-after", 3*time.Second, "how long without a presence beacon from a region before it counts as cut off and global limits shrink to --partition-share (a few beacon intervals of 500ms)")
	fs.BoolVar(&cfg.Extrapolate, "extrapolate", true, "count, in a region or global limit, the hits other PoPs have probably admitted since their last message (their recent rate × its age); false decides on what was heard only")
	fs.BoolVar(&repl.clockSync, "clock-sync", true, "agree on a clock with the other PoPs (the median of theirs, measured from the presence beacons) and decide on it, so every PoP starts a window at the same instant; false keeps the wall clock")
	fs.DurationVar(&repl.maxClockStep, "max-clock-step", 2*time.Second, "with --clock-sync, the largest correction of the wall clock; offsets past it are ignored")
	fs.DurationVar(&cfg.BoundedWait, "bounded-wait", pop.DefaultBoundedWait, "how long a check that a consistency: bounded limit denied waits for allowance another PoP is giving this one,\nand is then decided again (only while another PoP holds allowance it does not need: a client over its limit\nis denied at once); about a round trip between your farthest regions plus two --urgent-interval. 0: never wait")
	fs.Float64Var(&repl.partitionShare, "partition-share", 0, "share of a global limit each reachable region enforces while others are cut off (0: reachable regions / all regions)")
	fs.StringVar(&repl.natsURL, "nats", "", "NATS `URL` of the region's servers; empty runs an embedded NATS server with JetStream under --data")
	fs.StringVar(&repl.natsUser, "nats-user", "", "NATS user name")
	fs.StringVar(&repl.natsPass, "nats-password", "", "NATS password (visible in argv: prefer --nats-password-file or EDGELIMIT_NATS_PASSWORD)")
	fs.StringVar(&repl.natsCreds, "nats-creds", "", "NATS credentials `file`")
	fs.StringVar(&repl.natsNKey, "nats-nkey", "", "NATS nkey seed `file`: this PoP's own credential ('edgelimit natsconf' writes one per PoP)")
	fs.StringVar(&repl.natsCA, "nats-ca", "", "CA `file` for NATS over TLS (the same as --nats-tls-ca)")
	repl.natsAuthFlags(fs)
	fs.DurationVar(&repl.catchUp, "catchup-timeout", 5*time.Second, "a restarted replicated PoP fails /readyz until it has applied its region's stream up to where it ended\nwhen the PoP started (what the others admitted while it was down); after this long it serves anyway and logs why")
	fs.BoolVar(&cfg.HoldReplicated, "catchup-hold", true, "while catching up (--catchup-timeout), checks of region and global limits wait for it (pop-scope ones never wait);\nfalse decides them at once on what the PoP knows")
	fs.IntVar(&repl.natsListen, "nats-port", -1, "client port of the embedded NATS server (-1: a free port), opened only with --nats-authorized-keys\nor --nats-allow-anonymous")
	fs.IntVar(&repl.leafListen, "nats-leaf-port", 0, "embedded NATS: accept other regions' leaf connections on this port (the hub region; 0: none)")
	fs.StringVar(&repl.natsDirect, "nats-direct", "", "also take from other regions' NATS servers, each region on a connection of its own beside the stream, their\nmitigation bits and the counts of keys near their limit: `region=nats://host:4222,…;region=…` (a link held up behind a lost segment then\nholds only one of two paths)")
	fs.Var(&repl.leafRemotes, "nats-leaf-remote", "embedded NATS: connect to the hub region's leaf `URL` (nats-leaf://host:port), comma-separated or repeated")
	fs.StringVar(&cfg.Quotas, "quotas", "embedded", "tenant quota store: embedded (a file under --data, for a single PoP) or a PostgreSQL `URL`\n(postgres://user@host:5432/db; the system of record, shared by every PoP)")
	fs.DurationVar(&cfg.QuotasPoll, "quotas-poll", quota.DefaultPoll, "how often to ask the quota store for changes besides PostgreSQL's LISTEN/NOTIFY (a backstop)")
	fs.StringVar(&cfg.AdminListen, "admin-listen", "", "`address` of the admin API (/admin/v1/quotas, /admin/v1/usage; off when empty; needs --admin-token-file)")
	fs.StringVar(&adminTokenFile, "admin-token-file", "", "`file` holding the admin API's bearer token (one line; never on the command line)")
	fs.StringVar(&level, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&format, "log-format", "text", "log format: text or json")
	fs.StringVar(&config, "config", "", "YAML `file` of settings, keyed by flag name")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), popUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, &config); err != nil {
		return err
	}
	ignoredEnv, err := applyEnvoyProfile(fs, envoyCompat)
	if err != nil {
		return err
	}
	cfg.EnvoyCompat = envoyCompat
	if cfg.DefaultAlgorithm, err = limit.ParseAlgorithm(defaultAlgorithm); err != nil {
		return fmt.Errorf("--default-algorithm: %v", err)
	}
	set, err := pop.ParseHeaderSet(headers)
	if err != nil {
		return fmt.Errorf("--headers: %v", err)
	}
	for i, n := range []string{"envoy-header-limit", "envoy-header-remaining", "envoy-header-reset"} {
		if err := headerName(n, envoyNames[i]); err != nil {
			return err
		}
	}
	if set != pop.DefaultHeaders {
		cfg.Headers = &pop.Headers{Set: set, EnvoyNames: envoyNames}
	}
	cfg.Rules = rules.values
	switch {
	case cfg.TopKeys < 0:
		return fmt.Errorf("--top-keys must be ≥ 0, got %d", cfg.TopKeys)
	case cfg.MaxKeys <= 0:
		return fmt.Errorf("--max-keys must be > 0, got %d", cfg.MaxKeys)
	case cfg.RulesInterval <= 0:
		return fmt.Errorf("--rules-interval must be > 0, got %v", cfg.RulesInterval)
	case cfg.ReadTimeout <= 0:
		return fmt.Errorf("--read-timeout must be > 0, got %v", cfg.ReadTimeout)
	case bodyMemoryMiB < 24:
		return fmt.Errorf("--max-body-memory-mib must be at least 24 (one largest batch), got %d", bodyMemoryMiB)
	case grpcMaxStreams < 1 || grpcMaxStreams > math.MaxUint32:
		return fmt.Errorf("--grpc-max-streams must be between 1 and %d, got %d", uint32(math.MaxUint32), grpcMaxStreams)
	case cfg.GRPCMaxConns < 1:
		return fmt.Errorf("--grpc-max-conns must be > 0, got %d", cfg.GRPCMaxConns)
	case cfg.ClientIPHeader == "" || strings.ContainsAny(cfg.ClientIPHeader, " :\t\r\n"):
		return fmt.Errorf("--client-ip-header must be a header name, got %q", cfg.ClientIPHeader)
	}
	if cfg.BoundedWait < 0 {
		return fmt.Errorf("--bounded-wait must be >= 0, got %v", cfg.BoundedWait)
	}
	cfg.GRPCMaxStreams = uint32(grpcMaxStreams)
	cfg.MaxBodyMemory = int64(bodyMemoryMiB) << 20
	cfg.HideMitigations = !mitigationsEndpoint
	if redisPasswordFile != "" {
		pw, err := readSecret(redisPasswordFile)
		if err != nil {
			return fmt.Errorf("--redis-password-file: %w", err)
		}
		cfg.RedisPassword = pw
	}
	if adminTokenFile != "" {
		tok, err := readSecret(adminTokenFile)
		if err != nil {
			return fmt.Errorf("--admin-token-file: %w", err)
		}
		cfg.AdminToken = tok
	}
	if cfg.AdminListen != "" && cfg.AdminToken == "" {
		return errors.New("--admin-listen needs --admin-token-file (the bearer token is never taken from the command line)")
	}
	if cfg.QuotasPoll <= 0 {
		return fmt.Errorf("--quotas-poll must be > 0, got %v", cfg.QuotasPoll)
	}
	topo, err := repl.validate()
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, level, format)
	if err != nil {
		return err
	}
	cfg.Logger = log
	cfg.Version = buildVersion()
	routeRedisLog(log)
	if len(ignoredEnv) > 0 {
		log.Warn("Envoy's ratelimit's settings are in the environment but read only with --envoy-compat (or set the flags they mean)", "variables", strings.Join(ignoredEnv, ","))
	}
	switch {
	case repl.flush <= 0:
		return fmt.Errorf("--flush-interval must be > 0, got %v", repl.flush)
	case minFreeMiB < 0:
		return fmt.Errorf("--data-min-free-mib must be >= 0, got %d", minFreeMiB)
	}
	dur := &durable{dir: cfg.DataDir, replica: repl.pop, interval: repl.flush, minFree: max(minFreeMiB<<20, -1), log: log}
	if minFreeMiB == 0 {
		dur.minFree = -1 // no check
	}
	cfg.Durable = dur.hook
	if repl.pop != "" {
		cfg.Replica, cfg.RegionPeers, cfg.Replicas = repl.pop, topo.Peers(repl.pop), topo.Others(repl.pop)
		cfg.Region, cfg.Topology, cfg.PartitionShare = repl.region, topo, repl.partitionShare
		cfg.Replicate = repl.replicator(topo, dur, log)
	}
	if err := setGCPercent(gcPercent); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return node.Run(ctx, cfg)
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// readSecret reads a one-line secret from file, without its line ending.
func readSecret(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", fmt.Errorf("%s is empty", file)
	}
	if strings.ContainsAny(pw, "\r\n") {
		return "", fmt.Errorf("%s holds more than one line", file)
	}
	return pw, nil
}

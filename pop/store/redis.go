package store

import (
	"context"
	_ "embed" // the Lua script
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgelimit/edgelimit/pop/limit"
)

//go:embed scripts/check.lua
var checkLua string

// checkScript is check.lua; its SHA-1 is computed once, client-side.
var checkScript = redis.NewScript(checkLua)

// Defaults of RedisConfig.
const (
	DefaultRedisTimeout  = 5 * time.Millisecond
	DefaultBatchWindow   = 100 * time.Microsecond
	DefaultMaxBatch      = 128
	DefaultPipelines     = 4
	DefaultClockInterval = time.Second
)

// minRedisWindow is the shortest window a window algorithm may have in the
// Redis store: the script keeps floor(now/window) as a Lua double, exact only
// below 2^53.
const minRedisWindow = int64(time.Microsecond)

var (
	// ErrClosed is returned by checks on a closed Redis store.
	ErrClosed = errors.New("store: redis store is closed")
	// ErrTimeout is returned (wrapped, together with context.DeadlineExceeded)
	// when a check has no answer by its deadline.
	ErrTimeout = errors.New("store: redis check timed out")
)

// ClockSource says whose clock defines the window boundaries of a Redis store.
type ClockSource uint8

const (
	// ClockRedis, the default, shifts every now a check is given by the
	// measured offset between the store's local clock and the Redis server's
	// TIME, so that all servers sharing one Redis agree on where a window
	// begins even when their own clocks disagree by hundreds of milliseconds.
	ClockRedis ClockSource = iota
	// ClockLocal passes now through unchanged: the caller's clock decides.
	// Tests and the shared table use it, since they give fixed instants.
	ClockLocal
)

func (c ClockSource) String() string {
	switch c {
	case ClockRedis:
		return "redis"
	case ClockLocal:
		return "local"
	}
	return fmt.Sprintf("ClockSource(%d)", uint8(c))
}

// ParseClockSource maps "redis" or "local" to a ClockSource; "" is ClockRedis.
func ParseClockSource(s string) (ClockSource, error) {
	switch s {
	case "", "redis":
		return ClockRedis, nil
	case "local":
		return ClockLocal, nil
	}
	return 0, fmt.Errorf("unknown clock source %q (want redis or local)", s)
}

// RedisConfig configures a Redis store. Its zero value, with a URL, is the
// production default.
type RedisConfig struct {
	// URL locates the server: redis://[user:pass@]host:port[/db] (rediss:// for
	// TLS), or a comma-separated list of host:port seeds (optionally the first
	// one a redis:// URL) for a Redis Cluster. Query parameters of go-redis's
	// ParseURL / ParseClusterURL (dial_timeout, pool_size, …) are honoured.
	URL string
	// Password, when set, authenticates instead of the URL's password (so
	// that the secret need not travel in the URL, the command line or logs).
	Password string
	// Cluster forces a Cluster client for a URL with a single seed.
	Cluster bool
	// Timeout is a check's deadline when its context has none sooner;
	// 0 means DefaultRedisTimeout.
	Timeout time.Duration
	// BatchWindow is how long a pipeline waits for more checks after its first
	// one, while another pipeline is in flight, before it is sent; 0 means
	// DefaultBatchWindow, negative means always send what is queued at once.
	BatchWindow time.Duration
	// MaxBatch bounds the checks in one pipeline; 0 means DefaultMaxBatch.
	MaxBatch int
	// Pipelines is how many pipelines may be in flight at once (each on its
	// own connection); 0 means DefaultPipelines.
	Pipelines int
	// ClockSource says whose clock defines window boundaries (ClockRedis by
	// default; see ClockSource).
	ClockSource ClockSource
	// ClockInterval is how often ClockRedis samples the server's TIME;
	// 0 means DefaultClockInterval.
	ClockInterval time.Duration
	// Clock is the local clock, in nanoseconds since the epoch, that the now
	// given to CheckAt comes from, and that Check reads. nil means the wall
	// clock. Tests inject a skewed one.
	Clock func() int64
	// Replica names this PoP as a CRDT replica; every server of the PoP
	// sharing the Redis gives the same name. When set, window limits with
	// scope region or global decide on this PoP's and the other PoPs' counts
	// (see redis_replicated.go), and the store is a replication.Counts. When
	// empty, every limit counts this PoP's hits only.
	Replica string
	// RegionPeers are the other PoPs of this PoP's region, whose counts a
	// region-scoped limit adds to its own.
	RegionPeers []string
	// Replicas are the other PoPs of the topology: MemoryConfig.Replicas,
	// for this server's estimate.
	Replicas []string
	// Extrapolate, with Replica, makes a check of a region or global
	// window limit count, beside what Redis holds, the hits other PoPs
	// have probably admitted since their last news: the same guess as
	// MemoryConfig.Extrapolate, made by this server and handed to the
	// script (redis_estimate.go).
	Extrapolate bool
	// EstimateMiss, with Extrapolate, is MemoryConfig.EstimateMiss for
	// this server's estimate.
	EstimateMiss func(scope limit.Scope, hits float64)
	// SettledExcess, with Extrapolate, is MemoryConfig.SettledExcess for
	// this server's estimate.
	SettledExcess func(scope limit.Scope, pct float64)
	// DenyCacheKeys bounds the local cache of keys over their limit, which
	// answers their checks without Redis until they could have room
	// (redis_denycache.go): 0 means DefaultDenyCacheKeys, negative turns
	// the cache off.
	DenyCacheKeys int
}

// Redis is the counter store shared by the servers of a PoP, kept in Redis or
// a Redis-compatible server (Valkey, KeyDB, Dragonfly), standalone or Cluster.
// It implements the contract of limit.Decide with server-side Lua
// (scripts/check.lua, a line-by-line transcription of pop/limit), so it
// decides exactly as Memory does, and the shared table in limittest holds it
// to that.
//
// Each limit key lives in one Redis key, el:{<tag>}:<algorithm>:<key>, where
// tag is the FNV-64a hash of the key in hex: a stable hash tag, so a key
// always maps to the same Cluster slot. Every write sets a TTL that ends a
// second after the state turns idle (limit.Spec.IdleAt), so idle keys vanish
// on their own, with no scans.
//
// On a standalone server a check is one script call covering all its items,
// so it is atomic across them. In a Cluster, items whose keys share a slot are
// still one call; a check whose items span slots cannot be one atomic call, so
// it is done in two phases: a read-only peek per slot, and — only when every
// peek admits the request — a decide per slot that counts the hits. Between
// the phases another check may take the last room of a limit: the second
// phase then denies that limit without counting it there, but the slots that
// admitted have already counted the hits. The race never admits a request
// over a limit; it can charge the other limits of a request that ends up
// denied (the denial is then reported, with that item's decision). A request
// whose items all share one slot, and every single-item request, is exact.
//
// Concurrent checks are coalesced: each of Pipelines goroutines takes the
// checks queued (at most MaxBatch) and sends them in one round trip, so a
// busy PoP pays a round trip per batch rather than per check. The script
// calls of a batch are packed into as few script runs as the keys allow
// (check.lua takes many calls back to back): one EVALSHA for up to
// maxEvalItems items on a standalone server, one per slot in a Cluster. Redis
// spends a fixed cost per script run, comparable to a whole one-item check,
// so packing is what lets one Redis core decide more checks per second. Each
// call stays atomic, and so does a run; a call that fails in the script (a
// WRONGTYPE key) fails only its own check.
// While another pipeline is in flight a goroutine first waits up to
// BatchWindow for more checks to join; a check that finds the store idle is
// sent at once, since it has no one to share a round trip with (and Go
// cannot sleep for less than about a millisecond in an idle process).
//
// The script is loaded once (SCRIPT LOAD at open) and called with EVALSHA. A
// NOSCRIPT reply (script cache flushed, failover to a fresh node) is answered
// by re-sending those calls with EVAL, which caches the script again.
//
// A check waits for its answer until its context's deadline or Timeout,
// whichever is sooner, and then returns ErrTimeout. A check given up on may
// still be counted by Redis if its pipeline was already sent.
//
// Clocks: with ClockRedis (the default) the Redis server's clock defines where
// windows begin. The store samples TIME every ClockInterval, takes the
// fastest of a few round trips, and estimates offset = server time − local
// time at the round trip's midpoint; every now is shifted by it. Servers
// whose clocks are skewed by a few hundred milliseconds therefore agree on
// window boundaries to within half a round trip, without trusting NTP on
// every PoP server, and time is still injected (CheckAt(now)), so the
// decision code stays pure. Until the first sample succeeds the offset is 0.
// With ClockLocal now is used as given.
//
// Key TTLs are relative (SET … PX, PEXPIRE): computed from the now the check
// used, counted by the server from the moment of the write, and one second
// longer than limit.Spec.IdleAt asks, so that a server whose now lags the
// Redis clock (by the offset's error with ClockRedis, by its skew with
// ClockLocal) never finds the key of a full window expired and counts that
// window again from zero.
//
// A Redis is safe for concurrent use. Its zero value is not usable; call
// OpenRedis.
type Redis struct {
	client  redis.UniversalClient
	cluster bool
	cfg     RedisConfig

	queue   chan *request
	closing chan struct{}
	closed  atomic.Bool
	wg      sync.WaitGroup

	inflight atomic.Int32 // pipelines sent and not yet answered

	evalItems int // most items one script run carries (maxEvalItems)

	offset atomic.Int64 // server clock − local clock, ns (ClockRedis)
	synced atomic.Bool  // offset has been measured at least once
	agreed atomic.Int64 // the PoPs' clock agreement's correction, ns (SetClockOffset)

	reqs sync.Pool // *request

	rep *redisReplicated // nil without a replica name

	owner ownerState // whether another replica owns the Redis (redis_owner.go)

	leaseLoss leaseLoss // when this Redis's lease sets began (redis_leases.go)

	est      *replicated  // the in-process counts and guess of unheard hits (redis_estimate.go); nil without Replica
	estSwept atomic.Int64 // when est was last swept (store time, ns)

	lostRestores atomic.Uint64 // times ownSlots found Redis holding less than it had held

	offlinePending atomic.Bool   // pairs counted while Redis was away await restoreOffline
	offlineSem     chan struct{} // one restoreOffline at a time
	offlineDenials atomic.Uint64 // checks Redis admitted and recheckOffline denied

	deny *denyCache // keys over their limit (redis_denycache.go); nil when off

	servers serverSet // the servers sharing this Redis (redis_servers.go)
}

// LostRestores is how many times the store found Redis holding less of the
// PoP's own counts than it had held (Redis restarted empty or from an older
// snapshot), and put them back, with the other PoPs' counts.
func (s *Redis) LostRestores() uint64 { return s.lostRestores.Load() }

// OpenRedis connects a Redis store. It fails only on a bad configuration:
// a server that is down at start is not an error (checks fail until it is
// up, and the script is loaded on first use), so a PoP can start, and fall
// back (Fallback), while Redis is away. It spends up to a second loading the
// script and sampling the server's clock.
func OpenRedis(cfg RedisConfig) (*Redis, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultRedisTimeout
	}
	if cfg.BatchWindow == 0 {
		cfg.BatchWindow = DefaultBatchWindow
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Pipelines <= 0 {
		cfg.Pipelines = DefaultPipelines
	}
	if cfg.ClockInterval <= 0 {
		cfg.ClockInterval = DefaultClockInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = func() int64 { return time.Now().UnixNano() }
	}
	if cfg.ClockSource > ClockLocal {
		return nil, fmt.Errorf("store: redis: unknown clock source %d", cfg.ClockSource)
	}
	var s *Redis
	client, cluster, err := newRedisClient(cfg, func(ctx context.Context, cn *redis.Conn) error { return s.onConnect(ctx, cn) })
	if err != nil {
		return nil, err
	}
	s = &Redis{
		client:  client,
		cluster: cluster,
		cfg:     cfg,
		queue:   make(chan *request, cfg.MaxBatch*cfg.Pipelines*2),
		closing: make(chan struct{}),
		rep:     newRedisReplicated(cfg),
		est:     newRedisEstimate(cfg),

		offlineSem: make(chan struct{}, 1),
		deny:       newDenyCache(cfg.DenyCacheKeys),
		servers:    serverSet{id: newServerID()},

		evalItems: maxEvalItems,
	}
	s.reqs.New = func() any {
		t := time.NewTimer(time.Hour)
		t.Stop()
		return &request{done: make(chan struct{}, 1), timer: t}
	}

	// Best effort: load the script and learn the clock offset now rather
	// than on the first checks.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = checkScript.Load(ctx, client).Err()
	if s.rep != nil {
		_ = mergeScript.Load(ctx, client).Err()
	}
	if cfg.ClockSource == ClockRedis {
		_ = s.sampleClock(ctx)
	}
	err = s.claim(ctx, client)
	if err == nil {
		s.register(ctx)
	}
	cancel()
	if errors.Is(err, ErrReplicaConflict) {
		_ = client.Close()
		return nil, err
	}

	s.wg.Add(cfg.Pipelines)
	for range cfg.Pipelines {
		go s.pipeliner()
	}
	if cfg.ClockSource == ClockRedis {
		s.wg.Add(1)
		go s.clockLoop()
	}
	return s, nil
}

// newRedisClient builds the go-redis client for cfg.URL. A standalone
// server's client calls onConnect on every new connection (redis_owner.go).
func newRedisClient(cfg RedisConfig, onConnect func(context.Context, *redis.Conn) error) (redis.UniversalClient, bool, error) {
	u := strings.TrimSpace(cfg.URL)
	if u == "" {
		return nil, false, errors.New("store: redis: empty URL")
	}
	hasScheme := strings.Contains(u, "://")
	if strings.Contains(u, ",") || cfg.Cluster {
		seeds := strings.Split(u, ",")
		first := strings.TrimSpace(seeds[0])
		if !hasScheme {
			first = "redis://" + first
		}
		opt, err := redis.ParseClusterURL(first)
		if err != nil {
			return nil, false, fmt.Errorf("store: redis: cluster URL %q: %w", RedactURL(cfg.URL), redactURLError(err))
		}
		if cfg.Password != "" {
			opt.Password = cfg.Password
		}
		for _, a := range seeds[1:] {
			if a = strings.TrimSpace(a); a != "" {
				opt.Addrs = append(opt.Addrs, a)
			}
		}
		opt.MaxRetries = -1 // a limiter answers within its deadline or not at all
		opt.ContextTimeoutEnabled = true
		opt.DialTimeout = orDefault(opt.DialTimeout, time.Second) // each dial is also bounded by its check's deadline
		opt.DialerRetries = max(opt.DialerRetries, 1)
		opt.ReadTimeout = orDefault(opt.ReadTimeout, time.Second)
		opt.WriteTimeout = orDefault(opt.WriteTimeout, time.Second)
		opt.PoolTimeout = orDefault(opt.PoolTimeout, max(cfg.Timeout, 10*time.Millisecond))
		opt.DisableIdentity = true
		if opt.PipelinePoolSize == 0 {
			opt.PipelinePoolSize = noPipelinePool
		}
		return redis.NewClusterClient(opt), true, nil
	}
	if !hasScheme {
		u = "redis://" + u
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		return nil, false, fmt.Errorf("store: redis: URL %q: %w", RedactURL(cfg.URL), redactURLError(err))
	}
	if cfg.Password != "" {
		opt.Password = cfg.Password
	}
	opt.MaxRetries = -1
	opt.ContextTimeoutEnabled = true
	opt.DialTimeout = orDefault(opt.DialTimeout, time.Second) // each dial is also bounded by its check's deadline
	opt.DialerRetries = max(opt.DialerRetries, 1)
	opt.ReadTimeout = orDefault(opt.ReadTimeout, time.Second)
	opt.WriteTimeout = orDefault(opt.WriteTimeout, time.Second)
	opt.PoolTimeout = orDefault(opt.PoolTimeout, max(cfg.Timeout, 10*time.Millisecond))
	opt.DisableIdentity = true
	if opt.PipelinePoolSize == 0 {
		opt.PipelinePoolSize = noPipelinePool
	}
	opt.OnConnect = onConnect
	return redis.NewClient(opt), false, nil
}

// noPipelinePool: unless the URL sets pipeline_pool_size, pipelines run on
// the main connection pool rather than go-redis's dedicated pipeline pool.
// With the dedicated pool (go-redis v9.23), about one benchmark run in six on
// our test machine had one pipeline go unanswered until the 1 s read timeout;
// without it, none in twenty. The cause is not established; a check affected
// would time out at its own deadline and be answered by Fallback.
const noPipelinePool = -1

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Close stops the store's goroutines and closes its connections. Checks
// queued at that moment fail with ErrClosed, as do later ones. It returns the
// client's close error, if any, and is safe to call more than once.
func (s *Redis) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.closing)
	s.wg.Wait()
	s.unregister()
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("store: redis close: %w", err)
	}
	return nil
}

// Check is CheckAt at the local clock (RedisConfig.Clock).
func (s *Redis) Check(ctx context.Context, hits int64, items []limit.Item, out []limit.Decision) error {
	return s.CheckAt(ctx, s.cfg.Clock(), hits, items, out)
}

// DecisionTime is the instant a check given local now is decided at, on the
// clock that sets window boundaries: now plus the measured offset with
// ClockRedis, now with ClockLocal. A Fallback decides and mirrors its
// secondary's checks at the same instant, so that both count in the same
// windows.
func (s *Redis) DecisionTime(now int64) int64 {
	if s.cfg.ClockSource == ClockRedis {
		return now + s.offset.Load()
	}
	return now
}

// ClockOffset reports the offset ClockRedis applies (server clock minus
// local clock) and whether it has been measured yet.
func (s *Redis) ClockOffset() (time.Duration, bool) {
	return time.Duration(s.offset.Load()), s.synced.Load()
}

// CheckAt evaluates items at now (nanoseconds since the epoch, on the local
// clock) as one atomic step with the semantics of limit.Decide, writing one
// decision per item to out. With ClockRedis, now is first shifted onto the
// server's clock (see Redis).
//
// It returns an error, and leaves out undefined, when the check could not be
// answered: ErrTimeout (also matching context.DeadlineExceeded) when no answer
// came by the deadline, ctx's error when ctx ends first, ErrClosed after
// Close, a wrapped go-redis error when Redis failed, or an error wrapping
// ErrInvalidCheck and naming the problem for an invalid item (a spec failing
// limit.Spec.Validate, a window algorithm with a window under 1µs), hits < 1,
// a time before the epoch (after the clock offset) or out shorter than items.
func (s *Redis) CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error {
	if len(items) == 0 {
		return nil
	}
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.ownerConflict(); err != nil {
		return err
	}
	now = s.DecisionTime(now)
	if err := validateRedisCheck(now, hits, items, out); err != nil {
		return err
	}
	if s.deny != nil && hits == 1 && s.denyLocally(now, items, out) {
		return nil
	}

	deadline := time.Now().Add(s.cfg.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if s.offlinePending.Load() {
		// Hits counted while Redis was away go in first (redis_offline.go).
		rctx, cancel := context.WithDeadline(ctx, deadline)
		err := s.restoreOffline(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && rctx.Err() != nil {
				return s.timeoutErr()
			}
			return err
		}
	}
	var stBuf [maxInline]limit.State
	var sts []limit.State // the estimate's view of each item (nil without it)
	if s.est != nil {
		sts = s.estimates(now, items, stBuf[:0])
	}
	r := s.reqs.Get().(*request)
	r.prepare(s, now, hits, items, sts, deadline)
	r.timer.Reset(time.Until(deadline))

	select {
	case s.queue <- r:
	case <-r.timer.C:
		s.reqs.Put(r)
		return s.timeoutErr()
	case <-ctx.Done():
		r.timer.Stop()
		s.reqs.Put(r)
		return fmt.Errorf("store: redis check: %w", ctx.Err())
	}

	var err error
	select {
	case <-r.done:
		r.timer.Stop()
		return s.answered(now, hits, items, out, sts, r)
	case <-r.timer.C:
		err = s.timeoutErr()
	case <-ctx.Done():
		r.timer.Stop()
		err = fmt.Errorf("store: redis check: %w", ctx.Err())
	}
	if r.state.CompareAndSwap(reqWaiting, reqAbandoned) {
		return err // the pipeliner owns r now and recycles it
	}
	<-r.done // the answer arrived as the deadline did: use it
	return s.answered(now, hits, items, out, sts, r)
}

// answered copies r's answer to out, recycles r, and does what follows a
// check Redis answered: it caches the denials Redis made, then rechecks
// (redis_offline.go), tracks (redis_replicated.go) and estimates
// (redis_estimate.go).
func (s *Redis) answered(now, hits int64, items []limit.Item, out []limit.Decision, sts []limit.State, r *request) error {
	err := s.finish(r, out)
	if err == nil {
		s.noteDenials(now, hits, items, out)
	}
	return s.estimated(now, hits, items, out, sts, s.track(now, items, out, s.recheckOffline(now, hits, items, out, err)))
}

func (s *Redis) timeoutErr() error {
	return fmt.Errorf("%w (timeout %v or the context's deadline): %w", ErrTimeout, s.cfg.Timeout, context.DeadlineExceeded)
}

// finish copies r's answer to out and recycles r, which the caller owns.
func (s *Redis) finish(r *request, out []limit.Decision) error {
	err := r.err
	if err == nil {
		copy(out, r.res)
	}
	s.reqs.Put(r)
	return err
}

// validateRedisCheck returns an error wrapping ErrInvalidCheck when the
// check cannot be evaluated by the script.
func validateRedisCheck(now, hits int64, items []limit.Item, out []limit.Decision) error {
	if len(out) < len(items) {
		return fmt.Errorf("store: redis: %w: %d decisions for %d items", ErrInvalidCheck, len(out), len(items))
	}
	if hits < 1 {
		return fmt.Errorf("store: redis: %w: hits must be >= 1, got %d", ErrInvalidCheck, hits)
	}
	if now < 0 {
		return fmt.Errorf("store: redis: %w: time %d is before the epoch", ErrInvalidCheck, now)
	}
	for i := range items {
		sp := items[i].Spec
		if err := sp.Validate(); err != nil {
			return fmt.Errorf("store: redis: %w: item %d (%q): %w", ErrInvalidCheck, i, items[i].Key, err)
		}
		if (sp.Algorithm == limit.SlidingWindow || sp.Algorithm == limit.FixedWindow) && sp.Window < minRedisWindow {
			return fmt.Errorf("store: redis: %w: item %d (%q): %s window %dns is under the 1µs the Redis store supports",
				ErrInvalidCheck, i, items[i].Key, sp.Algorithm, sp.Window)
		}
	}
	return nil
}

// Request states.
const (
	reqWaiting uint32 = iota
	reqDone
	reqAbandoned
	// reqDetached: no caller waits (countDenied); the pipeliner runs it
	// and recycles it.
	reqDetached
)

// request is one check on its way through a pipeline. Its caller owns it
// until it is queued; then the pipeliner does, until it moves state from
// reqWaiting to reqDone (the caller owns it again and recycles it) or finds
// reqAbandoned (the caller gave up; the pipeliner recycles it).
type request struct {
	state    atomic.Uint32
	done     chan struct{} // one send when state becomes reqDone
	timer    *time.Timer   // the caller's deadline
	deadline time.Time
	hits     int64
	shadow   []bool
	cd       []bool // items[i] counts denied hits (check.lua's shadow 2)
	res      []limit.Decision
	calls    []call
	// multi marks a Cluster check spanning slots: calls are peeks first,
	// then decides (see Redis).
	multi bool
	err   error
}

// call is one call of check.lua: the items of one request that share a slot.
// Its fields are packed into blob in check.lua's binary layout (a header of
// mode, hits, now's hi and lo parts and the number of items, then per item
// algorithm, shadow, limit, window and the algorithm's own fields). Its keys
// are the items' keys, then rkeys (the remote hashes of replicated items).
// A call on its own is a valid script invocation (keys, and blob as the only
// argument); run packs many into one (see evalGroup).
type call struct {
	keys  []string
	rkeys []string
	blob  []byte
	idx   []int // the request's item index of each key
	slot  int   // the Cluster slot of its keys (0 on a standalone server)
	vals  []any // its answer, 4 integers per item, when err is nil
	err   error // why it has no answer
}

// prepare fills r for a check; r is fresh from the pool.
// sts, when not nil, holds the estimate's view of each item: its Unheard
// goes to the script with the item.
func (r *request) prepare(s *Redis, now, hits int64, items []limit.Item, sts []limit.State, deadline time.Time) {
	r.state.Store(reqWaiting)
	r.deadline, r.hits, r.err, r.multi = deadline, hits, nil, false
	r.shadow, r.cd = r.shadow[:0], r.cd[:0]
	r.res = r.res[:0]
	for i := range items {
		r.shadow = append(r.shadow, items[i].Shadow)
		r.cd = append(r.cd, items[i].CountsDenied())
		r.res = append(r.res, limit.Decision{})
	}
	for i := range r.calls {
		r.calls[i].vals, r.calls[i].err = nil, nil
	}
	r.calls = r.calls[:0]

	var kbuf [128]byte
	nowHi, nowLo := now/1e9, now%1e9 // now >= 0
	first := 0
	if s.cluster {
		first = keySlot(items[0].Key)
		for i := 1; i < len(items) && !r.multi; i++ {
			r.multi = keySlot(items[i].Key) != first
		}
	}
	if !r.multi {
		c := r.newCall(first)
		c.header('d', hits, nowHi, nowLo, len(items))
		for i := range items {
			c.add(s, kbuf[:0], i, &items[i], now, unheardOf(sts, i))
		}
		c.keys = append(c.keys, c.rkeys...)
		return
	}
	// One peek call per slot, items in their order within each.
	done := make([]bool, len(items))
	for i := range items {
		if done[i] {
			continue
		}
		sl := keySlot(items[i].Key)
		c := r.newCall(sl)
		c.header('p', hits, nowHi, nowLo, 0)
		for j := i; j < len(items); j++ {
			if !done[j] && keySlot(items[j].Key) == sl {
				done[j] = true
				c.add(s, kbuf[:0], j, &items[j], now, unheardOf(sts, j))
			}
		}
		binary.LittleEndian.PutUint32(c.blob[callItemsAt:], uint32(len(c.idx)))
		c.keys = append(c.keys, c.rkeys...)
	}
}

// Offsets in a call's blob, after check.lua's layout.
const (
	callModeAt  = 0  // 'd' or 'p'
	callItemsAt = 25 // the number of items, 4 bytes
)

// header starts c's blob: check.lua's "<c1i8i8i8i4".
func (c *call) header(mode byte, hits, nowHi, nowLo int64, n int) {
	c.blob = append(c.blob, mode)
	c.blob = binary.LittleEndian.AppendUint64(c.blob, uint64(hits))
	c.blob = binary.LittleEndian.AppendUint64(c.blob, uint64(nowHi))
	c.blob = binary.LittleEndian.AppendUint64(c.blob, uint64(nowLo))
	c.blob = binary.LittleEndian.AppendUint32(c.blob, uint32(n))
}

// newCall appends an empty call on slot to r.calls, reusing its buffers.
func (r *request) newCall(slot int) *call {
	if len(r.calls) < cap(r.calls) {
		r.calls = r.calls[:len(r.calls)+1]
	} else {
		r.calls = append(r.calls, call{})
	}
	c := &r.calls[len(r.calls)-1]
	c.keys, c.rkeys, c.blob, c.idx = c.keys[:0], c.rkeys[:0], c.blob[:0], c.idx[:0]
	c.slot = slot
	return c
}

// add appends item i of the request to c; unheard is its limit.State
// Unheard (0 for an item not counted across PoPs).
func (c *call) add(s *Redis, kbuf []byte, i int, it *limit.Item, now int64, unheard float64) {
	sp := it.Spec
	var shadow byte // check.lua: 1 shadow, 2 counts denied hits, 3 both
	if it.Shadow {
		shadow = 1
	}
	if it.CountsDenied() {
		shadow += 2
	}
	c.keys = append(c.keys, string(appendRedisKey(kbuf, it)))
	c.idx = append(c.idx, i)
	// check.lua's "<BBi8i8": algorithm, shadow, limit, window.
	c.blob = append(c.blob, byte(sp.Algorithm), shadow)
	c.blob = binary.LittleEndian.AppendUint64(c.blob, uint64(sp.Limit))
	c.blob = binary.LittleEndian.AppendUint64(c.blob, uint64(sp.Window))
	switch sp.Algorithm {
	case limit.SlidingWindow, limit.FixedWindow:
	case limit.TokenBucket, limit.GCRA: // "<i8": capacity
		c.blob = binary.LittleEndian.AppendUint64(c.blob, uint64(sp.Capacity()))
		return
	default: // the sliding log needs nothing more
		return
	}
	// "<i8i8i4BdB": window index, offset, remote key number, remote total
	// field, unheard, shrunk.
	start := limit.WindowStart(now, sp.Window)
	idx, off := start/sp.Window, now-start
	c.blob = binary.LittleEndian.AppendUint64(c.blob, uint64(idx))
	c.blob = binary.LittleEndian.AppendUint64(c.blob, uint64(off))
	if !s.replicates(it) {
		c.blob = binary.LittleEndian.AppendUint32(c.blob, 0)
		c.blob = append(c.blob, 0)
		c.blob = binary.LittleEndian.AppendUint64(c.blob, 0) // 0.0
		c.blob = append(c.blob, 0)
		return
	}
	c.blob = binary.LittleEndian.AppendUint32(c.blob, uint32(len(c.rkeys)+1))
	c.blob = append(c.blob, remoteField(it.Scope)[1]) // "~g" or "~r": check.lua adds the '~'
	c.blob = binary.LittleEndian.AppendUint64(c.blob, math.Float64bits(unheard))
	var shrunk byte
	if it.Shrunk {
		shrunk = 1
	}
	c.blob = append(c.blob, shrunk)
	// One statement each: kbuf is reused, and Go may convert both to strings
	// after both appends if they were arguments of one call.
	c.rkeys = append(c.rkeys, string(appendRemoteKey(kbuf[:0], it.Key, idx)))
	c.rkeys = append(c.rkeys, string(appendRemoteKey(kbuf[:0], it.Key, idx-1)))
}

// appendRedisKey appends it's Redis key, el:{<tag>}:<algorithm>:<key>.
func appendRedisKey(b []byte, it *limit.Item) []byte {
	b = append(b, "el:{"...)
	b = appendTag(b, it.Key)
	b = append(b, "}:"...)
	b = append(b, '0'+byte(it.Spec.Algorithm), ':')
	return append(b, it.Key...)
}

// appendTag appends key's hash tag: its FNV-64a hash in 16 hex digits. It
// must never change: it decides which Cluster slot holds a key.
func appendTag(b []byte, key []byte) []byte {
	const hex = "0123456789abcdef"
	h := fnv64a(key)
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, hex[(h>>uint(shift))&0xf])
	}
	return b
}

func fnv64a(key []byte) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for _, c := range key {
		h ^= uint64(c)
		h *= prime64
	}
	return h
}

// keySlot is the Cluster slot of key's Redis key: CRC16 of its tag mod 16384.
func keySlot(key []byte) int {
	var buf [16]byte
	return int(crc16(appendTag(buf[:0], key)) & 16383)
}

// crc16 is CRC-16/XMODEM, Redis Cluster's key hash.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// pipeliner is one of the store's Pipelines goroutines: it takes a batch of
// queued checks and runs it as one pipeline, until Close.
func (s *Redis) pipeliner() {
	defer s.wg.Done()
	batch := make([]*request, 0, s.cfg.MaxBatch)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var sc scratch
	for {
		select {
		case r := <-s.queue:
			batch = append(batch[:0], r)
		case <-s.closing:
			s.failQueued()
			return
		}
		batch = s.collect(batch, timer)
		s.runBatch(batch, &sc)
		clear(batch)
	}
}

// collect adds to batch what is queued, waiting up to BatchWindow for more,
// up to MaxBatch.
func (s *Redis) collect(batch []*request, timer *time.Timer) []*request {
	for len(batch) < s.cfg.MaxBatch {
		select {
		case r := <-s.queue:
			batch = append(batch, r)
			continue
		default:
		}
		break
	}
	// Wait for more only while another pipeline is in flight: a lone check
	// has no one to share a round trip with, and Go cannot sleep for less
	// than about a millisecond on an idle process, so waiting would cost it
	// far more than the window.
	if len(batch) >= s.cfg.MaxBatch || s.cfg.BatchWindow < 0 || s.inflight.Load() == 0 {
		return batch
	}
	timer.Reset(s.cfg.BatchWindow)
	for len(batch) < s.cfg.MaxBatch {
		select {
		case r := <-s.queue:
			batch = append(batch, r)
		case <-timer.C:
			return batch
		case <-s.closing:
			timer.Stop()
			return batch
		}
	}
	timer.Stop()
	return batch
}

// failQueued answers every queued check with ErrClosed.
func (s *Redis) failQueued() {
	for {
		select {
		case r := <-s.queue:
			r.err = ErrClosed
			s.deliver(r)
		default:
			return
		}
	}
}

// deliver hands r's answer to its caller, or recycles r if the caller left.
func (s *Redis) deliver(r *request) {
	if r.state.CompareAndSwap(reqWaiting, reqDone) {
		r.done <- struct{}{}
		return
	}
	s.reqs.Put(r)
}

// scratch is a pipeliner's reusable space for running a batch.
type scratch struct {
	calls  []*call
	groups []evalGroup
	open   map[int]int // Cluster: slot → index in groups of its open group
}

// evalGroup is one script run carrying the calls of many requests: on a
// standalone server consecutive calls of a batch, in a Cluster calls on one
// slot (a script's keys must share a slot), up to maxEvalItems items in all.
// Its keys and blob are its calls' concatenated, as check.lua reads them.
type evalGroup struct {
	items int
	keys  []string
	blob  []byte
	calls []*call
	cmd   *redis.Cmd
}

// maxEvalItems bounds the items of one script run (a call with more runs
// alone). A script blocks the server while it runs, so the bound keeps a run
// short: about 1 ms at 128 items on our 2-core test machine. Beyond about 16
// items a run, Redis's cost per item no longer falls measurably; with the
// default MaxBatch of 128 and single-item checks, a whole batch is one run.
const maxEvalItems = 128

// group packs calls into sc.groups and returns them.
func (s *Redis) group(sc *scratch, calls []*call) []evalGroup {
	for i := range sc.groups {
		g := &sc.groups[i]
		clear(g.calls) // let the requests' buffers go
		clear(g.keys)
		g.items, g.keys, g.blob, g.calls, g.cmd = 0, g.keys[:0], g.blob[:0], g.calls[:0], nil
	}
	sc.groups = sc.groups[:0]
	if sc.open == nil {
		sc.open = make(map[int]int)
	}
	clear(sc.open)
	for _, c := range calls {
		gi, ok := sc.open[c.slot]
		if !ok || sc.groups[gi].items+len(c.idx) > s.evalItems {
			gi = len(sc.groups)
			if gi < cap(sc.groups) {
				sc.groups = sc.groups[:gi+1]
			} else {
				sc.groups = append(sc.groups, evalGroup{})
			}
			sc.open[c.slot] = gi
		}
		g := &sc.groups[gi]
		g.items += len(c.idx)
		g.calls = append(g.calls, c)
		g.keys = append(g.keys, c.keys...)
		g.blob = append(g.blob, c.blob...)
	}
	return sc.groups
}

// runBatch runs the checks of batch and delivers their answers.
func (s *Redis) runBatch(batch []*request, sc *scratch) {
	calls := sc.calls[:0]
	defer func() { clear(calls); sc.calls = calls[:0] }()
	live := batch[:0]
	var deadline time.Time
	for _, r := range batch {
		if r.state.Load() == reqAbandoned {
			s.reqs.Put(r) // its caller gave up before it was sent
			continue
		}
		live = append(live, r)
		if r.deadline.After(deadline) {
			deadline = r.deadline
		}
		for i := range r.calls {
			calls = append(calls, &r.calls[i])
		}
	}
	if len(live) == 0 {
		return
	}
	s.inflight.Add(1)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	s.run(ctx, sc, calls)

	// Cluster checks spanning slots: decide what the peeks admitted.
	calls = calls[:0]
	for _, r := range live {
		if !r.collectResults() || !r.multi {
			r.multi = false
			continue
		}
		ok := true
		for i, d := range r.res {
			if !d.Allowed && !r.shadow[i] {
				ok = false
				break
			}
		}
		if !ok { // as limit.Decide: a denied request spends nothing
			countDenied := false
			for i := range r.res {
				countDenied = countDenied || r.cd[i]
				switch {
				case r.cd[i] && !r.res[i].Allowed:
					r.res[i].Remaining = 0 // its hits are counted below
				case r.res[i].Allowed && !r.cd[i]:
					r.res[i].Remaining += r.hits
				}
			}
			r.multi = false
			if countDenied { // but its CountDenied items count the hits
				for i := range r.calls {
					c := &r.calls[i]
					c.blob[callModeAt] = 'c'
					c.vals, c.err = nil, nil
					calls = append(calls, c)
				}
			}
			continue
		}
		for i := range r.calls {
			c := &r.calls[i]
			c.blob[callModeAt] = 'd'
			c.vals, c.err = nil, nil
			calls = append(calls, c)
		}
	}
	if len(calls) > 0 {
		s.run(ctx, sc, calls)
		for _, r := range live {
			if r.multi {
				r.collectResults()
			}
		}
	}
	s.inflight.Add(-1) // before the callers wake and queue their next checks
	for _, r := range live {
		s.deliver(r)
	}
}

// run sends calls, packed into script runs (see evalGroup), as one pipeline
// of EVALSHAs and, for the runs the server answers NOSCRIPT, a second
// pipeline of EVALs; then it hands each call its answer or error.
func (s *Redis) run(ctx context.Context, sc *scratch, calls []*call) {
	groups := s.group(sc, calls)
	pipe := s.client.Pipeline()
	for i := range groups {
		g := &groups[i]
		// g.blob is passed as is, not copied: go-redis writes it out in
		// Exec, and it is not reused before the next batch.
		g.cmd = pipe.EvalSha(ctx, checkScript.Hash(), g.keys, g.blob)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error

	retry := false
	for i := range groups {
		if redis.HasErrorPrefix(groups[i].cmd.Err(), "NOSCRIPT") {
			retry = true
			break
		}
	}
	if retry {
		pipe = s.client.Pipeline()
		for i := range groups {
			g := &groups[i]
			if redis.HasErrorPrefix(g.cmd.Err(), "NOSCRIPT") {
				g.cmd = pipe.Eval(ctx, checkLua, g.keys, g.blob)
			}
		}
		_, _ = pipe.Exec(ctx)
	}
	for i := range groups {
		groups[i].scatter()
	}
}

// scatter hands each call of g its part of g's answer: 4 integers per item,
// or one error in their place for a call that failed in the script. When the
// whole run failed (a timeout, a lost connection, OOM) every call gets its
// error.
func (g *evalGroup) scatter() {
	vals, err := g.cmd.Slice()
	if err == nil {
		p := 0
		for _, c := range g.calls {
			if p < len(vals) {
				if e, ok := vals[p].(error); ok {
					c.err = e
					p++
					continue
				}
			}
			n := 4 * len(c.idx)
			if p+n > len(vals) {
				break
			}
			c.vals = vals[p : p+n : p+n]
			p += n
		}
		if p == len(vals) {
			return
		}
		err = fmt.Errorf("script returned %d values for %d calls", len(vals), len(g.calls))
	}
	for _, c := range g.calls {
		c.vals, c.err = nil, err
	}
}

// collectResults decodes r's call answers into r.res, or sets r.err from
// the first failed call. It reports whether all succeeded.
func (r *request) collectResults() bool {
	for ci := range r.calls {
		c := &r.calls[ci]
		vals, err := c.vals, c.err
		if err == nil && len(vals) != 4*len(c.idx) {
			err = fmt.Errorf("script returned %d values for %d items", len(vals), len(c.idx))
		}
		if err != nil {
			if isTimeout(err) { // the batch's deadline is its latest caller's
				r.err = fmt.Errorf("store: redis check of %d item(s): %w: %w (%w)", len(r.res), ErrTimeout, context.DeadlineExceeded, err)
			} else {
				r.err = fmt.Errorf("store: redis check of %d item(s): %w", len(r.res), err)
			}
			return false
		}
		for j, i := range c.idx {
			v := vals[4*j : 4*j+4]
			a, _ := v[0].(int64)
			rem, _ := v[1].(int64)
			reset, _ := v[2].(int64)
			retry, _ := v[3].(int64)
			r.res[i] = limit.Decision{Allowed: a == 1, Remaining: rem, Reset: reset, RetryAfter: retry}
		}
	}
	return true
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// clockLoop samples the server's clock every ClockInterval until Close.
func (s *Redis) clockLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ClockInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), max(s.cfg.ClockInterval/2, 10*time.Millisecond))
			_ = s.sampleClock(ctx) // on failure the last offset stands
			cancel()
		case <-s.closing:
			return
		}
	}
}

// clockSamples is how many TIME round trips a sample takes; the fastest wins.
const clockSamples = 3

// sampleClock measures the offset between the server's TIME and the local
// clock at the midpoint of the fastest of a few round trips.
func (s *Redis) sampleClock(ctx context.Context) error {
	best := time.Duration(-1)
	var offset int64
	var lastErr error
	for range clockSamples {
		local := s.cfg.Clock()
		start := time.Now()
		server, err := s.client.Time(ctx).Result()
		rtt := time.Since(start)
		if err != nil {
			lastErr = err
			continue
		}
		if best < 0 || rtt < best {
			best = rtt
			offset = server.UnixNano() - (local + int64(rtt/2))
		}
	}
	if best < 0 {
		return fmt.Errorf("store: redis TIME: %w", lastErr)
	}
	s.offset.Store(offset)
	s.synced.Store(true)
	return nil
}

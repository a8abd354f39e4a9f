package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	dialTimeout = 5 * time.Second
	readBufSize = 8 << 10 // longest response header line accepted
	maxBackoff  = time.Second
)

// Report is the outcome of one run. It is a plain value: safe to copy and to
// read concurrently; the zero value is an empty report. Latencies cover
// answered requests only, from writing the request to reading the last body
// byte, with about 1% relative error (Max is exact).
type Report struct {
	Requests  int64         `json:"requests"`             // requests answered with a parsable HTTP response
	Decisions int64         `json:"decisions"`            // rate-limit decisions: checks in requests answered 200 or 429
	Errors    int64         `json:"errors"`               // failed dials and requests (write/read/parse errors)
	LastError string        `json:"last_error,omitempty"` // one of the errors, for diagnosis; "" when Errors == 0
	Status    map[int]int64 `json:"status"`               // HTTP status code -> responses; never nil after Run
	Elapsed   time.Duration `json:"elapsed_ns"`           // from the first request to the end of the last
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	P999      time.Duration `json:"p999_ns"`
	Max       time.Duration `json:"max_ns"`
	// Timeline counts decisions per Unix second, with Config.Timeline.
	Timeline []Second `json:"timeline,omitempty"`

	Seed     uint64 `json:"seed"`      // Config.Seed: the run's values are reproducible from it
	KeySpace int64  `json:"key_space"` // values the distribution draws from: 1 for HotKey, Config.Keys otherwise
	// DistinctKeys is how many distinct values the checks sent carried:
	// the checks of requests written whole to the connection (grpc-go's
	// client: of calls answered). It is exact for key spaces up to 2^27
	// values, a HyperLogLog estimate (about 1% off) above, which
	// DistinctEstimated says.
	DistinctKeys      int64 `json:"distinct_keys_sent"`
	DistinctEstimated bool  `json:"distinct_keys_estimated,omitempty"`
}

// RequestsPerSecond is Requests over Elapsed (0 when nothing elapsed).
func (r Report) RequestsPerSecond() float64 { return perSecond(r.Requests, r.Elapsed) }

// DecisionsPerSecond is Decisions over Elapsed (0 when nothing elapsed).
func (r Report) DecisionsPerSecond() float64 { return perSecond(r.Decisions, r.Elapsed) }

func perSecond(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// String renders the report as a short human-readable table.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "requests   %d in %v  (%.0f req/s)\n", r.Requests, r.Elapsed.Round(time.Millisecond), r.RequestsPerSecond())
	if r.Decisions != r.Requests {
		fmt.Fprintf(&b, "decisions  %d  (%.0f decisions/s)\n", r.Decisions, r.DecisionsPerSecond())
	}
	approx := ""
	if r.DistinctEstimated {
		approx = "≈"
	}
	fmt.Fprintf(&b, "keys       distinct keys sent: %s%d of %d (%.1f%%)\n", approx, r.DistinctKeys, r.KeySpace,
		100*float64(r.DistinctKeys)/float64(max(r.KeySpace, 1)))
	fmt.Fprintf(&b, "latency    p50 %s  p99 %s  p99.9 %s  max %s\n", fmtDur(r.P50), fmtDur(r.P99), fmtDur(r.P999), fmtDur(r.Max))
	codes := make([]int, 0, len(r.Status))
	for c := range r.Status {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	b.WriteString("status    ")
	if len(codes) == 0 {
		b.WriteString(" none")
	}
	for _, c := range codes {
		fmt.Fprintf(&b, " %d: %d (%.1f%%)", c, r.Status[c], 100*float64(r.Status[c])/float64(max(r.Requests, 1)))
	}
	fmt.Fprintf(&b, "\nerrors     %d", r.Errors)
	if r.LastError != "" {
		fmt.Fprintf(&b, "  (last: %s)", r.LastError)
	}
	b.WriteByte('\n')
	return b.String()
}

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.3fs", d.Seconds())
}

// Run validates cfg, checks that the target accepts TCP connections, and then
// drives it from cfg.Concurrency connections until cfg.Duration has passed,
// cfg.Requests requests have been sent, or ctx is cancelled, whichever comes
// first. Cancelling ctx is a normal way to end a run early: the report of
// what was done is still returned, with a nil error. Run returns an error
// only for an invalid cfg or an unreachable target. Requests cut off by the
// end of the run are neither counted nor treated as errors. A request that
// fails counts against cfg.Requests. Run is safe to call concurrently.
func Run(ctx context.Context, cfg Config) (Report, error) {
	t, err := cfg.validate()
	if err != nil {
		return Report{}, err
	}
	if t.cfg.RawGRPC {
		return runH2(ctx, &t)
	}
	if t.cfg.GRPC != "" {
		return runGRPC(ctx, &t)
	}
	r := &run{t: t, dialer: net.Dialer{Timeout: dialTimeout}}
	probe, err := r.dialer.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return Report{}, fmt.Errorf("loadgen: cannot connect to %s: %w", t.addr, err)
	}
	probe.Close()

	start := time.Now()
	keys := newKeySet(keySpace(&t.cfg))
	workers := make([]*worker, t.cfg.Concurrency)
	for i := range workers {
		workers[i] = &worker{req: newRenderer(&t, i, keys), pace: newPacer(t.cfg.Rate, len(workers), i, start)}
		if t.cfg.Timeline {
			workers[i].tl = timeline{}
		}
	}
	runCtx, cancel := context.WithTimeout(ctx, t.cfg.Duration)
	defer cancel()

	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { r.work(runCtx, w) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-runCtx.Done():
		r.halt(workers)
		<-done
	}
	return report(time.Since(start), &t.cfg, workers, keys), nil
}

// report sums the workers' counts into a Report.
func report(elapsed time.Duration, cfg *Config, workers []*worker, keys *keySet) Report {
	rep := Report{Elapsed: elapsed, Status: map[int]int64{}, Seed: cfg.Seed, KeySpace: int64(keySpace(cfg))}
	var exact bool
	rep.DistinctKeys, exact = keys.count()
	rep.DistinctEstimated = !exact
	var h histogram
	var tls []timeline
	for _, w := range workers {
		if w.tl != nil {
			tls = append(tls, w.tl)
		}
		h.merge(&w.hist)
		rep.Requests += w.requests
		rep.Decisions += w.decisions
		rep.Errors += w.errors
		if w.lastErr != nil {
			rep.LastError = w.lastErr.Error()
		}
		for code, n := range w.status {
			if n > 0 {
				rep.Status[code] += n
			}
		}
	}
	rep.P50, rep.P99, rep.P999 = h.quantile(0.50), h.quantile(0.99), h.quantile(0.999)
	rep.Max = time.Duration(h.max)
	if tls != nil {
		rep.Timeline = mergeTimelines(tls)
	}
	return rep
}

// run is the state shared by a run's workers.
type run struct {
	t      target
	dialer net.Dialer
	stop   atomic.Bool  // set once the run is over
	issued atomic.Int64 // requests started, against cfg.Requests
}

// worker owns one connection. Only its goroutine touches its fields, except
// conn, which it writes under mu so that halt can interrupt it.
type worker struct {
	req  *renderer // renders each request as it is sent; nil for grpc-go's client
	pace pacer
	tl   timeline // nil unless Config.Timeline

	mu   sync.Mutex
	conn net.Conn

	hist      histogram
	status    [1000]int64 // indexed by status code (100..999)
	requests  int64
	decisions int64
	errors    int64
	lastErr   error
}

// halt ends the run: workers stop at their next iteration, and requests in
// flight are interrupted by an expired deadline.
func (r *run) halt(workers []*worker) {
	r.stop.Store(true)
	for _, w := range workers {
		w.mu.Lock()
		if w.conn != nil {
			w.conn.SetDeadline(time.Unix(1, 0))
		}
		w.mu.Unlock()
	}
}

func (r *run) work(ctx context.Context, w *worker) {
	defer r.setConn(w, nil)
	cfg := &r.t.cfg
	checks := int64(max(cfg.Batch, 1))
	br := bufio.NewReaderSize(nil, readBufSize)
	var backoff time.Duration
	for !r.stop.Load() {
		if w.conn == nil {
			c, err := r.dialer.DialContext(ctx, "tcp", r.t.addr)
			if err != nil {
				if r.stop.Load() || ctx.Err() != nil {
					return
				}
				w.fail(err)
				backoff = min(max(2*backoff, 10*time.Millisecond), maxBackoff)
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				continue
			}
			backoff = 0
			if !r.setConn(w, c) {
				return // the run ended while dialing
			}
			br.Reset(c)
		}
		if cfg.Requests > 0 && r.issued.Add(1) > cfg.Requests {
			return
		}
		req := w.req.render()
		if !w.pace.wait(ctx) {
			return
		}
		start := time.Now()
		_, err := w.conn.Write(req)
		written, status, closeConn := err == nil, 0, false
		if written {
			status, closeConn, err = readResponse(br)
		}
		lat := time.Since(start)
		if written {
			w.req.sent()
		}
		if err != nil {
			if !r.stop.Load() {
				w.fail(err)
			}
			r.setConn(w, nil)
			continue
		}
		w.hist.record(lat)
		w.tl.add(start.Add(lat), status)
		w.status[status]++
		w.requests++
		if status == 200 || status == 429 {
			w.decisions += checks
		}
		if closeConn {
			r.setConn(w, nil)
		}
	}
}

func (w *worker) fail(err error) {
	w.errors++
	w.lastErr = err
}

// setConn replaces the worker's connection, closing the old one. Installing
// a new connection fails (and closes it) once the run has been halted.
func (r *run) setConn(w *worker, c net.Conn) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil {
		w.conn.Close()
	}
	w.conn = c
	if c != nil && r.stop.Load() {
		c.Close()
		w.conn = nil
		return false
	}
	return true
}

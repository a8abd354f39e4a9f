// Package httpapi is a PoP's HTTP interface:
//
//	POST /v1/check        one check, the JSON mapping of Envoy's RateLimitRequest
//	POST /v1/check/batch  many independent checks in one request
//	POST /v1/release      free concurrency leases a check handed out
//	GET  /v1/mitigations  the mitigation bits in force
//	ANY  /v1/authz[/...]  forward auth for nginx auth_request, Traefik
//	                      ForwardAuth and Envoy ext_authz (HTTP)
//	GET  /healthz         the process is up
//	GET  /readyz          the PoP can answer checks
//	GET  /metrics         Prometheus
//	GET  /status          the PoP's state for a person (HTML) or a tool (?format=json)
//	GET  /                redirects to /status
//
// Every check response carries X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (Unix seconds), and the IETF RateLimit-Policy and
// RateLimit fields (draft-ietf-httpapi-ratelimit-headers-10) for the most
// restrictive limit; a denial adds Retry-After, which is never earlier than the
// RateLimit field's t. Malformed requests get 400 with a JSON body naming the
// problem.
package httpapi

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/topkeys"
)

// Bounds on request bodies.
const (
	// DefaultMaxBody caps a check's body.
	DefaultMaxBody = 64 << 10
	// MaxBatch caps the checks of one batch request.
	MaxBatch = 1000
	// DefaultMaxBodyMemory bounds the memory held by request bodies in
	// flight (Config.MaxBodyMemory).
	DefaultMaxBodyMemory = 64 << 20
	// presize is the most a body buffer is sized up front from the
	// request's Content-Length; past it the buffer grows as data arrives,
	// so a client cannot make the server allocate what it only announces.
	presize = 16 << 10
	// DefaultClientIPHeader is Config.ClientIPHeader's default. Every proxy
	// the examples document appends the client's address to it, so its
	// last address is the proxy's word even when a client sends its own
	// (nginx's $proxy_add_x_forwarded_for, Caddy's forward_auth, Traefik's
	// ForwardAuth, Envoy with use_remote_address).
	DefaultClientIPHeader = "X-Forwarded-For"
	// maxPooled is the largest body or output buffer kept for reuse;
	// larger ones, grown by an occasional big batch, go to the collector.
	maxPooled = 64 << 10
)

// Config configures a Server.
type Config struct {
	Engine *pop.Engine
	// Mitigations, when set, is listed by GET /v1/mitigations.
	Mitigations *pop.Mitigations
	// TopKeys, when set, is listed by GET /v1/top (left out with
	// HideMitigations, as it lists key values too).
	TopKeys *topkeys.Sketch
	// Metrics may be nil.
	Metrics *pop.Metrics
	// MetricsHandler serves /metrics; nil leaves it out.
	MetricsHandler http.Handler
	// Ready reports whether the PoP can answer checks; nil means always.
	Ready func() error
	// Status, when set, makes the PoP's state for GET /status (status.go),
	// and GET / redirects there. It is called once per request.
	Status func() *Status
	// MaxBody caps request bodies; 0 means DefaultMaxBody (×MaxBatch/8 for batches).
	MaxBody int64
	// MaxBodyMemory bounds the bytes held for request bodies (and their
	// decoding) by all requests in flight together; a request that would
	// exceed it gets 503 with Retry-After. 0 means DefaultMaxBodyMemory. It
	// should be at least a batch's MaxBody, or large batches always fail.
	MaxBodyMemory int64
	// HideMitigations leaves GET /v1/mitigations out (404): it lists key
	// values, possibly API keys, to anyone who can reach the port.
	HideMitigations bool
	// ClientIPHeader names the header /v1/authz reads the client's address
	// from (the rules' client_ip): its last address, the one the proxy in
	// front of edgelimit appended or wrote; without the header, the peer's
	// address. Name only a header the operator's proxy writes or appends
	// to: a header the proxy passes through from the client lets a client
	// choose the address that limits it (Caddy's forward_auth passes a
	// client's X-Real-IP). Empty means DefaultClientIPHeader.
	ClientIPHeader string
	// DecodeProto, when set, decodes a check body in Envoy's protobuf JSON
	// mapping (grpcapi.DecodeJSON); /v1/check tries it on a body its own
	// decoder refuses, so both snake_case and camelCase requests work.
	DecodeProto func(body []byte) (*pop.Request, error)
	// Headers selects the rate limit fields of check and forward-auth
	// responses; nil means pop.DefaultHeaders.
	Headers *pop.Headers
	Logger  *slog.Logger
	// Now reads the clock; nil means time.Now. The simulator and tests set it.
	Now func() time.Time
}

// Server serves the HTTP API. It is safe for concurrent use.
type Server struct {
	cfg  Config
	mux  *http.ServeMux
	bufs sync.Pool // *reqState

	bodyMemory atomic.Int64 // bytes charged by requests in flight (budget)
}

// reqState is one request's reusable memory.
type reqState struct {
	body  []byte
	out   []byte
	req   pop.Request
	res   pop.Result
	batch []pop.Request

	charged int64 // bytes of Server.bodyMemory this request holds
}

// getState takes a request state from the pool.
func (s *Server) getState() *reqState { return s.bufs.Get().(*reqState) }

// putState releases st's share of the body budget and pools it, without
// buffers grown past maxPooled.
func (s *Server) putState(st *reqState) {
	s.release(st)
	if cap(st.body) > maxPooled {
		st.body = make([]byte, 0, 1024)
	}
	if cap(st.out) > maxPooled {
		st.out = make([]byte, 0, 1024)
	}
	if cap(st.batch) > 64 {
		st.batch = nil
	}
	s.bufs.Put(st)
}

// errBusy is readBody's error when the body budget is spent.
var errBusy = errors.New("too many request bodies in flight; retry shortly")

// charge takes n more bytes of the body budget for st, or reports false
// (taking nothing) when that would exceed it.
func (s *Server) charge(st *reqState, n int64) bool {
	if n <= 0 {
		return true
	}
	if s.bodyMemory.Add(n) > s.cfg.MaxBodyMemory {
		s.bodyMemory.Add(-n)
		return false
	}
	st.charged += n
	return true
}

// release returns st's share of the body budget.
func (s *Server) release(st *reqState) {
	if st.charged != 0 {
		s.bodyMemory.Add(-st.charged)
		st.charged = 0
	}
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.MaxBodyMemory <= 0 {
		cfg.MaxBodyMemory = DefaultMaxBodyMemory
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ClientIPHeader == "" {
		cfg.ClientIPHeader = DefaultClientIPHeader
	}
	cfg.ClientIPHeader = textproto.CanonicalMIMEHeaderKey(cfg.ClientIPHeader)
	s := &Server{cfg: cfg, mux: http.NewServeMux()}
	s.bufs.New = func() any { return &reqState{body: make([]byte, 0, 1024), out: make([]byte, 0, 1024)} }
	s.mux.HandleFunc("/v1/check", s.handleCheck)
	s.mux.HandleFunc("/v1/check/batch", s.handleBatch)
	s.mux.HandleFunc("/v1/release", s.handleRelease)
	if !cfg.HideMitigations {
		s.mux.HandleFunc("/v1/mitigations", s.handleMitigations)
		if cfg.TopKeys != nil {
			s.mux.HandleFunc("/v1/top", onlyGet(s.handleTop))
		}
	}
	s.mux.HandleFunc("/v1/authz", s.handleAuthz)
	s.mux.HandleFunc("/v1/authz/", s.handleAuthz)
	s.mux.HandleFunc("/healthz", onlyGet(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, []byte(`{"status":"ok"}`))
	}))
	s.mux.HandleFunc("/readyz", onlyGet(s.handleReady))
	if cfg.MetricsHandler != nil {
		s.mux.HandleFunc("/metrics", onlyGet(cfg.MetricsHandler.ServeHTTP))
	}
	if cfg.Status != nil {
		s.mux.HandleFunc("/status", onlyGet(s.handleStatus))
	}
	s.mux.HandleFunc("/", s.handleRoot)
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// onlyGet answers methods other than GET and HEAD with a JSON 405.
func onlyGet(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "", "use GET")
			return
		}
		h(w, r)
	}
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			writeError(w, http.StatusServiceUnavailable, "NOT_READY", "", err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, []byte(`{"status":"ready"}`))
}

func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "", "use POST with a JSON RateLimitRequest body")
		return
	}
	st := s.getState()
	defer s.putState(st)
	if err := s.readBody(w, r, st, s.cfg.MaxBody); err != nil {
		s.bodyFailed(w, "check", err)
		return
	}
	if !decodeFast(st.body, &st.req) {
		// A fresh value: encoding/json merges into existing slice elements,
		// which would keep strings of an earlier request.
		st.req = pop.Request{}
		if err := s.decodeSlow(st, &st.req); err != nil {
			// Envoy's protobuf JSON (hitsAddend, integers as strings, units
			// by number) is a request too; when that fails as well, the
			// plain decoder's message names the problem.
			req, perr := s.decodeProto(st.body, err)
			if perr != nil {
				s.bodyFailed(w, "check", err)
				return
			}
			st.req = *req
		} else if !utf8.Valid(st.body) {
			field := invalidUTF8Field(&st.req, "")
			s.badRequest(w, "check", cmp.Or(field, "body"), cmp.Or(field, "body")+": invalid UTF-8")
			return
		}
	}
	now := s.cfg.Now()
	err := s.cfg.Engine.CheckLeaseAt(r.Context(), now, &st.req, &st.res)
	s.cfg.Metrics.ObserveCheck("check", s.cfg.Now().Sub(now))
	if err != nil {
		s.checkFailed(w, "check", err)
		return
	}
	s.setHeaders(w.Header(), now, &st.res)
	setLease(w.Header(), &st.res)
	st.out = appendResult(st.out[:0], &st.res)
	status := http.StatusOK
	if st.res.Code == pop.OverLimit {
		status = http.StatusTooManyRequests
		// The Envoy-shaped result gains the error object of a client-facing 429.
		st.out = append(st.out[:len(st.out)-1], `,"error":`...)
		st.out = appendDenial(st.out, &st.req, &st.res)
		st.out = append(st.out, '}')
	}
	writeJSON(w, status, st.out)
}

type batchRequest struct {
	Checks []pop.Request `json:"checks"`
}

func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "", `use POST with {"checks":[RateLimitRequest, ...]}`)
		return
	}
	st := s.getState()
	defer s.putState(st)
	if err := s.readBody(w, r, st, s.cfg.MaxBody*MaxBatch/8); err != nil {
		s.bodyFailed(w, "batch", err)
		return
	}
	var batch batchRequest
	if decodeBatchFast(st.body, &st.batch) {
		batch.Checks = st.batch
	} else {
		if err := s.decodeSlow(st, &batch); err != nil {
			s.bodyFailed(w, "batch", err)
			return
		}
		if !utf8.Valid(st.body) {
			field := "checks"
			for i := range batch.Checks {
				if f := invalidUTF8Field(&batch.Checks[i], fmt.Sprintf("checks[%d].", i)); f != "" {
					field = f
					break
				}
			}
			s.badRequest(w, "batch", field, field+": invalid UTF-8")
			return
		}
	}
	switch {
	case len(batch.Checks) == 0:
		s.badRequest(w, "batch", "checks", "checks: at least one check is required")
		return
	case len(batch.Checks) > MaxBatch:
		s.badRequest(w, "batch", "checks", fmt.Sprintf("checks: %d checks, the limit is %d", len(batch.Checks), MaxBatch))
		return
	}
	now := s.cfg.Now()
	out := append(st.out[:0], `{"results":[`...)
	for i := range batch.Checks {
		if i > 0 {
			out = append(out, ',')
		}
		if err := s.cfg.Engine.CheckAt(r.Context(), now, &batch.Checks[i], &st.res); err != nil {
			out = appendCheckError(out, i, err)
		} else {
			out = appendResult(out, &st.res)
		}
	}
	out = append(out, "]}"...)
	st.out = out
	s.cfg.Metrics.ObserveCheck("batch", s.cfg.Now().Sub(now))
	writeJSON(w, http.StatusOK, out)
}

// handleMitigations lists the mitigation bits in force:
// {"mitigations":[{"key","scope","until","retry_after","origin"}]}, keys
// rendered by rules.DescribeKey, until in RFC 3339, retry_after in seconds.
func (s *Server) handleMitigations(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		writeError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "", "use GET")
		return
	}
	now := s.cfg.Now()
	b := []byte(`{"mitigations":[`)
	if s.cfg.Mitigations != nil {
		for i, bit := range s.cfg.Mitigations.Active(now.UnixNano()) {
			if i > 0 {
				b = append(b, ',')
			}
			until := time.Unix(0, bit.Until).UTC()
			b = append(b, `{"key":`...)
			b = appendString(b, rules.DescribeKey(bit.Key))
			b = append(b, `,"scope":"`...)
			b = append(b, limit.Scope(bit.Scope).String()...)
			b = append(b, `","until":"`...)
			b = until.AppendFormat(b, time.RFC3339Nano)
			b = append(b, `","retry_after":`...)
			b = strconv.AppendInt(b, seconds(until.Sub(now)), 10)
			b = append(b, `,"origin":`...)
			b = appendString(b, bit.Origin)
			b = append(b, '}')
		}
	}
	writeJSON(w, http.StatusOK, append(b, "]}"...))
}

// appendCheckError appends the error object of batch check i.
func appendCheckError(out []byte, i int, err error) []byte {
	var re *pop.RequestError
	if errors.As(err, &re) {
		out = append(out, `{"error":{"code":"BAD_REQUEST","field":`...)
		out = appendString(out, fmt.Sprintf("checks[%d].%s", i, re.Field))
		out = append(out, `,"message":`...)
		out = appendString(out, re.Error())
		return append(out, `}}`...)
	}
	out = append(out, `{"error":{"code":"STORE_UNAVAILABLE","message":`...)
	out = appendString(out, err.Error())
	return append(out, `}}`...)
}

// readBody reads r's body into st.body, at most limit bytes. The buffer
// starts at most presize bytes whatever Content-Length announces, and grows
// as data arrives; every byte of it is charged to the server's body budget
// (released by putState). Its errors are a *bodyError or errBusy.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, st *reqState, limit int64) error {
	if r.ContentLength > limit {
		return &bodyError{http.StatusBadRequest, "BAD_REQUEST", fmt.Sprintf("body: %d bytes, the limit is %d", r.ContentLength, limit)}
	}
	buf := st.body[:0]
	if n := int(min(r.ContentLength, presize)); cap(buf) < n {
		buf = make([]byte, 0, n)
	}
	if !s.charge(st, int64(cap(buf))) {
		return errBusy
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	var err error
	for {
		if len(buf) == cap(buf) {
			grown := int64(max(2*cap(buf), 4096))
			if r.ContentLength > 0 { // no more than announced (+1 to see EOF)
				grown = min(grown, max(r.ContentLength+1, int64(cap(buf))+512))
			}
			grown = min(grown, limit+1)
			if !s.charge(st, grown-int64(cap(buf))) {
				st.body = buf
				return errBusy
			}
			nb := make([]byte, len(buf), grown)
			copy(nb, buf)
			buf = nb
		}
		var n int
		n, err = body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			break
		}
	}
	st.body = buf
	var tooBig *http.MaxBytesError
	switch {
	case errors.Is(err, io.EOF):
	case errors.As(err, &tooBig):
		return &bodyError{http.StatusBadRequest, "BAD_REQUEST", fmt.Sprintf("body: larger than the limit of %d bytes", limit)}
	case isTimeout(err):
		return &bodyError{http.StatusRequestTimeout, "REQUEST_TIMEOUT", "body: not received within the server's read timeout"}
	default:
		return &bodyError{http.StatusBadRequest, "BAD_REQUEST", fmt.Sprintf("body: %v", err)}
	}
	if len(st.body) == 0 {
		return &bodyError{http.StatusBadRequest, "BAD_REQUEST", "body: empty; want a JSON object"}
	}
	return nil
}

// bodyError is a request body that could not be read or decoded.
type bodyError struct {
	status int
	code   string
	msg    string
}

func (e *bodyError) Error() string { return e.msg }

// isTimeout reports whether err is a read deadline passing.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// bodyFailed answers a request whose body could not be read or decoded.
func (s *Server) bodyFailed(w http.ResponseWriter, api string, err error) {
	var be *bodyError
	switch {
	case errors.Is(err, errBusy):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "OVERLOADED", "", err.Error())
	case errors.As(err, &be) && be.status != http.StatusBadRequest:
		w.Header().Set("Connection", "close")
		writeError(w, be.status, be.code, "", be.msg)
	default:
		s.badRequest(w, api, "", err.Error())
	}
}

// decodeSlow decodes st.body into v with decodeStrict, after charging the
// body budget for the decoder's copy of the body and the strings it makes
// (about twice the body).
func (s *Server) decodeSlow(st *reqState, v any) error {
	if !s.charge(st, 2*int64(len(st.body))) {
		return errBusy
	}
	return decodeStrict(st.body, v)
}

// decodeProto decodes body with Config.DecodeProto after the plain decoder
// failed with err; it returns err itself when there is no DecodeProto or the
// failure was not about the body's contents (the memory budget).
func (s *Server) decodeProto(body []byte, err error) (*pop.Request, error) {
	if s.cfg.DecodeProto == nil || errors.Is(err, errBusy) {
		return nil, err
	}
	return s.cfg.DecodeProto(body)
}

// invalidUTF8Field names the first field of req that holds U+FFFD, the
// replacement encoding/json makes for invalid UTF-8, prefixed by prefix, or
// "" when none does.
func invalidUTF8Field(req *pop.Request, prefix string) string {
	if strings.ContainsRune(req.Domain, utf8.RuneError) {
		return prefix + "domain"
	}
	for i, d := range req.Descriptors {
		for j, e := range d.Entries {
			if strings.ContainsRune(e.Key, utf8.RuneError) {
				return fmt.Sprintf("%sdescriptors[%d].entries[%d].key", prefix, i, j)
			}
			if strings.ContainsRune(e.Value, utf8.RuneError) {
				return fmt.Sprintf("%sdescriptors[%d].entries[%d].value", prefix, i, j)
			}
		}
	}
	return ""
}

// decodeStrict decodes one JSON value into v, rejecting unknown fields and
// trailing data, with messages that say where the problem is.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return fmt.Errorf("malformed JSON at byte %d: %v", se.Offset, se)
		case errors.As(err, &te):
			return fmt.Errorf("field %s: want %s, got JSON %s", te.Field, te.Type, te.Value)
		case errors.Is(err, io.ErrUnexpectedEOF):
			return errors.New("malformed JSON: unexpected end of body")
		}
		return fmt.Errorf("malformed request: %v", err)
	}
	if dec.More() {
		return errors.New("malformed JSON: data after the request object")
	}
	return nil
}

func (s *Server) badRequest(w http.ResponseWriter, api, field, msg string) {
	s.cfg.Metrics.BadRequest(api)
	writeError(w, http.StatusBadRequest, "BAD_REQUEST", field, msg)
}

func (s *Server) checkFailed(w http.ResponseWriter, api string, err error) {
	var re *pop.RequestError
	if errors.As(err, &re) {
		s.badRequest(w, api, re.Field, re.Error())
		return
	}
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	s.cfg.Logger.Error("check failed", "api", api, "err", err)
	writeError(w, http.StatusServiceUnavailable, "STORE_UNAVAILABLE", "", err.Error())
}

// seconds rounds d up to whole seconds, as headers carry them.
func seconds(d time.Duration) int64 { return pop.Seconds(d) }

// setHeaders writes the rate limit fields of res that Config.Headers
// selects to h (pop.HeaderValues, by default).
func (s *Server) setHeaders(h http.Header, now time.Time, res *pop.Result) {
	if !s.cfg.Headers.Default() {
		var buf [len(pop.HeaderNames) + 3]pop.Field
		for _, f := range s.cfg.Headers.AppendFields(buf[:0], now, res) {
			h.Set(f.Name, f.Value)
		}
		return
	}
	vals := pop.HeaderValues(now, res)
	for i := range vals {
		h[pop.HeaderNames[i]] = vals[i : i+1 : i+1]
	}
}

// appendResult appends res as Envoy's RateLimitResponse JSON.
func appendResult(b []byte, res *pop.Result) []byte {
	b = append(b, `{"overall_code":"`...)
	b = append(b, res.Code.String()...)
	b = append(b, `","statuses":[`...)
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"code":"`...)
		b = append(b, st.Code.String()...)
		b = append(b, '"')
		if st.Limit != nil {
			b = append(b, `,"current_limit":{"name":`...)
			b = appendString(b, st.Limit.Name)
			b = append(b, `,"requests_per_unit":`...)
			b = strconv.AppendInt(b, st.Limit.Spec.Limit, 10)
			b = append(b, `,"unit":"`...)
			b = append(b, unitName(st.Limit)...)
			b = append(b, `"},"limit_remaining":`...)
			b = strconv.AppendInt(b, st.Remaining, 10)
			b = append(b, `,"duration_until_reset":"`...)
			b = strconv.AppendInt(b, seconds(st.UntilReset()), 10)
			b = append(b, `s"`...)
		} else if st.Unlimited {
			b = append(b, `,"limit_remaining":4294967295`...)
		}
		b = append(b, '}')
	}
	b = append(b, ']')
	b = appendLease(b, res)
	return append(b, '}')
}

// appendDenial appends the client-facing error object of a 429.
func appendDenial(b []byte, req *pop.Request, res *pop.Result) []byte {
	st := &res.Statuses[res.Decisive]
	retry := max(seconds(st.RetryAfter), 1)
	entries := req.Descriptors[res.Decisive].Entries
	b = append(b, `{"code":"RATE_LIMITED","message":"Rate limit exceeded for `...)
	b = appendDescriptor(b, entries)
	b = append(b, `. Retry after `...)
	b = strconv.AppendInt(b, retry, 10)
	b = append(b, ` seconds.","retry_after":`...)
	b = strconv.AppendInt(b, retry, 10)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, st.Limit.Spec.Limit, 10)
	b = append(b, `,"window":"`...)
	b = append(b, window(st.Limit)...)
	b = append(b, `","scope":"`...)
	b = appendDescriptor(b, entries)
	b = append(b, `","policy":`...)
	b = appendString(b, st.Limit.Name)
	return append(b, '}')
}

// appendDescriptor appends entries as "key:value:key:value" (pop.Descriptor's
// Describe), escaped for the inside of a JSON string.
func appendDescriptor(b []byte, entries []rules.Entry) []byte {
	for i, e := range entries {
		if i > 0 {
			b = append(b, ':')
		}
		b = appendStringBody(b, e.Key)
		b = append(b, ':')
		b = appendStringBody(b, e.Value)
	}
	return b
}

// shortDuration renders a unit's window as 1s, 1m, 1h or 1d.
func shortDuration(d time.Duration) string {
	switch d {
	case time.Second:
		return "1s"
	case time.Minute:
		return "1m"
	case time.Hour:
		return "1h"
	case 24 * time.Hour:
		return "1d"
	}
	return d.String()
}

// appendString appends s as a JSON string.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendStringBody(b, s)
	return append(b, '"')
}

// appendStringBody appends s escaped for the inside of a JSON string.
func appendStringBody(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
		case r == '\u2028' || r == '\u2029':
			b = append(b, `\u202`...)
			b = append(b, hex[r&0xf])
		case r == 0xfffd:
			b = append(b, `\ufffd`...) // invalid UTF-8 in the input
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return b
}

// jsonType is shared by every response; its capacity is its length, so an
// append by anyone copies rather than writing into it.
var jsonType = []string{"application/json"}

// writeJSON writes a JSON response. net/http sets Content-Length itself for a
// body this small written at once.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header()["Content-Type"] = jsonType[:1:1]
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeError writes {"error":{"code","message"[,"field"]}}.
func writeError(w http.ResponseWriter, status int, code, field, msg string) {
	b := append([]byte(`{"error":{"code":"`), code...)
	b = append(b, `","message":`...)
	b = appendString(b, msg)
	if field != "" {
		b = append(b, `,"field":`...)
		b = appendString(b, field)
	}
	b = append(b, "}}"...)
	writeJSON(w, status, b)
}

// trimPrefixPath strips the /v1/authz prefix Envoy's ext_authz path_prefix adds.
func trimPrefixPath(p string) string {
	p = strings.TrimPrefix(p, "/v1/authz")
	if p == "" {
		return "/"
	}
	return p
}

package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// AdminConfig configures the admin API (NewAdmin).
type AdminConfig struct {
	// Store keeps the quotas; Engine gives the rules (to check a quota's
	// tier and limit names) and reads usage.
	Store  quota.Store
	Engine *pop.Engine
	// Token is the bearer token every request must carry.
	Token  string
	Logger *slog.Logger
	// Now is the clock of usage reads; nil is time.Now.
	Now func() time.Time
	// StoreTimeout bounds each request's calls to the quota store: past it
	// the request is answered 503 (a store that accepts connections and
	// never answers holds no admin request longer). 0 means
	// DefaultAdminStoreTimeout.
	StoreTimeout time.Duration
}

// DefaultAdminStoreTimeout is AdminConfig.StoreTimeout's default.
const DefaultAdminStoreTimeout = 10 * time.Second

// Admin bounds.
const (
	maxAdminBody    = 64 << 10
	defaultPageSize = 100
	maxPageSize     = 1000
	maxActorBytes   = 128
)

//go:embed openapi.json
var openAPIDoc []byte

// adminRoute is one route of the admin API; the OpenAPI document describes
// exactly these (a test keeps them equal).
type adminRoute struct {
	method, path string
	handle       func(*admin, http.ResponseWriter, *http.Request)
}

var adminRoutes = []adminRoute{
	{"GET", "/admin/v1/quotas", (*admin).list},
	{"PUT", "/admin/v1/quotas/{api_key}", (*admin).put},
	{"GET", "/admin/v1/quotas/{api_key}", (*admin).get},
	{"DELETE", "/admin/v1/quotas/{api_key}", (*admin).delete},
	{"GET", "/admin/v1/audit/{api_key}", (*admin).audit},
	{"GET", "/admin/v1/usage/{api_key}", (*admin).usage},
	{"GET", "/admin/v1/openapi.json", (*admin).openapi},
}

type admin struct {
	cfg   AdminConfig
	token [sha256.Size]byte
	mux   *http.ServeMux
}

// NewAdmin returns the admin API: quotas per API key (PUT, GET, DELETE
// /admin/v1/quotas/{api_key}; GET /admin/v1/quotas?tier=&after=&limit= lists
// them by tier, a page at a time), their audit trail, a key's usage of every
// limit it has (a read that counts nothing), and its OpenAPI description.
// Every request needs "Authorization: Bearer <token>" (401 without it);
// bad input is a 400 whose JSON error names the field.
func NewAdmin(cfg AdminConfig) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultAdminStoreTimeout
	}
	a := &admin{cfg: cfg, token: sha256.Sum256([]byte(cfg.Token)), mux: http.NewServeMux()}
	for _, r := range adminRoutes {
		a.mux.HandleFunc(r.method+" "+r.path, func(w http.ResponseWriter, req *http.Request) { r.handle(a, w, req) })
	}
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "NOT_FOUND", "", "no such admin route: "+r.Method+" "+r.URL.Path)
	})
	return a
}

func (a *admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !a.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="edgelimit-admin"`)
		writeError(w, http.StatusUnauthorized, "UNAUTHORIZED", "Authorization", "a valid 'Authorization: Bearer <token>' header is required")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), a.cfg.StoreTimeout)
	defer cancel()
	// A route that exists with another method: 405 in JSON, not the mux's text.
	rec := &methodCheck{ResponseWriter: w}
	a.mux.ServeHTTP(rec, r.WithContext(ctx))
}

// methodCheck turns the mux's plain-text 405 into a JSON error.
type methodCheck struct {
	http.ResponseWriter
	swallow bool
}

func (m *methodCheck) WriteHeader(status int) {
	if status == http.StatusMethodNotAllowed {
		m.swallow = true
		m.ResponseWriter.Header().Del("X-Content-Type-Options")
		writeError(m.ResponseWriter, status, "METHOD_NOT_ALLOWED", "", "method not allowed; allowed: "+m.ResponseWriter.Header().Get("Allow"))
		return
	}
	m.ResponseWriter.WriteHeader(status)
}

func (m *methodCheck) Write(b []byte) (int, error) {
	if m.swallow {
		return len(b), nil
	}
	return m.ResponseWriter.Write(b)
}

// authorized compares the bearer token in constant time (of hashes, so that
// not even the token's length leaks).
func (a *admin) authorized(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return false
	}
	got := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(got[:], a.token[:]) == 1
}

// actor is who made a change, for the audit trail: the X-Admin-Actor header
// when given (bounded), else "admin@<client address>".
func actor(r *http.Request) string {
	if v := r.Header.Get("X-Admin-Actor"); v != "" {
		if len(v) > maxActorBytes {
			v = v[:maxActorBytes]
		}
		return v
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "admin@" + host
}

// pathKey returns the {api_key} of the path, validated, or writes the 400.
func pathKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	key := r.PathValue("api_key")
	if err := quota.ValidateKey(key); err != nil {
		adminFailed(w, err)
		return "", false
	}
	return key, true
}

// adminFailed answers err: a field error is a 400 naming the field, a
// missing quota a 404, anything else a 503 (the store does not answer). The
// 503 says only "quota store unavailable": the store's error names the
// database's user, name and address, which are the operator's to read (in
// the log, see storeFailed), not a client's.
func adminFailed(w http.ResponseWriter, err error) {
	var fe *quota.FieldError
	switch {
	case errors.As(err, &fe):
		writeError(w, http.StatusBadRequest, "BAD_REQUEST", fe.Field, fe.Error())
	case errors.Is(err, quota.ErrNotFound):
		writeError(w, http.StatusNotFound, "NOT_FOUND", "api_key", err.Error())
	default:
		writeError(w, http.StatusServiceUnavailable, "STORE_UNAVAILABLE", "", "quota store unavailable")
	}
}

// storeFailed answers an error of a quota store call (adminFailed), logging
// it when the store failed (not for a missing quota or a bad field).
func (a *admin) storeFailed(w http.ResponseWriter, r *http.Request, op string, err error) {
	var fe *quota.FieldError
	if !errors.As(err, &fe) && !errors.Is(err, quota.ErrNotFound) {
		a.cfg.Logger.Error("admin: quota store unavailable", "op", op, "path", r.URL.Path, "err", err)
	}
	adminFailed(w, err)
}

func writeAdminJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "INTERNAL", "", err.Error())
		return
	}
	writeJSON(w, status, b)
}

// decodeAdmin decodes one JSON object into v, naming the field of a problem.
func decodeAdmin(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxAdminBody+1))
	if err != nil {
		return &quota.FieldError{Field: "body", Msg: "cannot read the body: " + err.Error()}
	}
	if len(body) > maxAdminBody {
		return &quota.FieldError{Field: "body", Msg: fmt.Sprintf("is larger than %d bytes", maxAdminBody)}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return &quota.FieldError{Field: "body", Msg: fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, se)}
		case errors.As(err, &te):
			return &quota.FieldError{Field: te.Field, Msg: fmt.Sprintf("want %s, got JSON %s", te.Type, te.Value)}
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return &quota.FieldError{Field: "body", Msg: "malformed JSON: the body is empty or cut short"}
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return &quota.FieldError{Field: strings.Trim(f, `"`), Msg: "unknown field"}
		}
		// time.Time's own errors ("parsing time ...") say nothing of the field.
		var pe *time.ParseError
		if errors.As(err, &pe) {
			return &quota.FieldError{Field: "effective_at/expires_at", Msg: "want an RFC 3339 time such as 2026-02-01T00:00:00Z: " + err.Error()}
		}
		return &quota.FieldError{Field: "body", Msg: err.Error()}
	}
	if dec.More() {
		return &quota.FieldError{Field: "body", Msg: "malformed JSON: data after the object"}
	}
	return nil
}

// checkRules checks q against the rules in force: its tier must be a tier of
// a domain with tenants, and every override must name a limit an override may
// replace (rules.Tenants.Overridable), with a quota that limit's algorithm
// can hold.
func (a *admin) checkRules(q *quota.Quota) error {
	var tenants []*rules.Tenants
	for _, d := range a.cfg.Engine.Rules().Domains() {
		if d.Tenants != nil {
			tenants = append(tenants, d.Tenants)
		}
	}
	if len(tenants) == 0 {
		return &quota.FieldError{Field: "api_key", Msg: "no domain of the rules has a tenants section, so no quota would apply"}
	}
	if q.Tier != "" && !slices.ContainsFunc(tenants, func(t *rules.Tenants) bool { return t.HasTier(q.Tier) }) {
		var names []string
		for _, t := range tenants {
			names = append(names, t.TierNames()...)
		}
		return &quota.FieldError{Field: "tier", Msg: fmt.Sprintf("%q is not a tier of the rules (tiers: %s)", q.Tier, strings.Join(names, ", "))}
	}
	limits := a.cfg.Engine.Rules().Limits()
	for i := range q.Overrides {
		o := &q.Overrides[i]
		if name, ok := policyName(tenants, o.Descriptor); ok {
			o.Descriptor = name
			for j := range i { // the other form of a limit already overridden
				if q.Overrides[j].Descriptor == name {
					return &quota.FieldError{Field: fmt.Sprintf("overrides[%d].descriptor", i), Msg: fmt.Sprintf("%q is already overridden by overrides[%d]", name, j)}
				}
			}
		}
		if !slices.ContainsFunc(tenants, func(t *rules.Tenants) bool { return t.Overridable(o.Descriptor) }) {
			return &quota.FieldError{Field: fmt.Sprintf("overrides[%d].descriptor", i),
				Msg: fmt.Sprintf("%q names no tier limit and no limit of a descriptor below the tenant entry (see the RateLimit-Policy names)", o.Descriptor)}
		}
		for _, l := range limits {
			if l.Name != o.Descriptor {
				continue
			}
			if _, err := quota.Overridden(l, o); err != nil {
				return &quota.FieldError{Field: fmt.Sprintf("overrides[%d].requests_per_unit", i), Msg: fmt.Sprintf("does not fit the %s limit %q: %v", l.Spec.Algorithm, l.Name, err)}
			}
		}
	}
	return nil
}

// policyName returns the limit name (the RateLimit-Policy name, e.g.
// "api_key.endpoint=POST /api/v1/orders") an override written as the quota
// API's specification writes it names: "endpoint:POST /api/v1/orders", the
// key and value of a descriptor entry below the tenant entry. It reports
// false when d is not of that form or names no limit an override may
// replace; d is then taken as a limit name.
func policyName(tenants []*rules.Tenants, d string) (string, bool) {
	key, value, ok := strings.Cut(d, ":")
	if !ok || key == "" || strings.ContainsAny(key, "=.") {
		return "", false
	}
	for _, t := range tenants {
		if t.Overridable(d) {
			return "", false // already a limit's name
		}
		if name := t.Key + "." + key + "=" + value; t.Overridable(name) {
			return name, true
		}
	}
	return "", false
}

func (a *admin) put(w http.ResponseWriter, r *http.Request) {
	key, ok := pathKey(w, r)
	if !ok {
		return
	}
	var body quota.Wire
	if err := decodeAdmin(r, &body); err != nil {
		adminFailed(w, err)
		return
	}
	if body.UpdatedAt != nil {
		adminFailed(w, &quota.FieldError{Field: "updated_at", Msg: "is set by the store, not by a request"})
		return
	}
	q, err := quota.FromWire(key, &body)
	if err == nil {
		err = a.checkRules(q)
	}
	if err != nil {
		adminFailed(w, err)
		return
	}
	before, err := a.cfg.Store.Put(r.Context(), q, actor(r))
	if err != nil {
		a.storeFailed(w, r, "put", err)
		return
	}
	status := http.StatusOK
	if before == nil {
		status = http.StatusCreated
	}
	writeAdminJSON(w, status, q.ToWire())
}

func (a *admin) get(w http.ResponseWriter, r *http.Request) {
	key, ok := pathKey(w, r)
	if !ok {
		return
	}
	q, err := a.cfg.Store.Get(r.Context(), key)
	if err != nil {
		a.storeFailed(w, r, "get", err)
		return
	}
	writeAdminJSON(w, http.StatusOK, q.ToWire())
}

func (a *admin) delete(w http.ResponseWriter, r *http.Request) {
	key, ok := pathKey(w, r)
	if !ok {
		return
	}
	if _, err := a.cfg.Store.Delete(r.Context(), key, actor(r)); err != nil {
		a.storeFailed(w, r, "delete", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// quotaPage is a page of GET /admin/v1/quotas.
type quotaPage struct {
	Quotas []*quota.Wire `json:"quotas"`
	// Next is the "after" of the next page; empty on the last page.
	Next string `json:"next,omitempty"`
}

func (a *admin) list(w http.ResponseWriter, r *http.Request) {
	qv := r.URL.Query()
	tier, after := qv.Get("tier"), qv.Get("after")
	limit := defaultPageSize
	if s := qv.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPageSize {
			adminFailed(w, &quota.FieldError{Field: "limit", Msg: fmt.Sprintf("must be an integer from 1 to %d, got %q", maxPageSize, s)})
			return
		}
		limit = n
	}
	if len(tier) > quota.MaxTierBytes {
		adminFailed(w, &quota.FieldError{Field: "tier", Msg: fmt.Sprintf("is longer than %d bytes", quota.MaxTierBytes)})
		return
	}
	if len(after) > quota.MaxKeyBytes {
		adminFailed(w, &quota.FieldError{Field: "after", Msg: fmt.Sprintf("is longer than %d bytes", quota.MaxKeyBytes)})
		return
	}
	qs, err := a.cfg.Store.List(r.Context(), tier, after, limit+1)
	if err != nil {
		a.storeFailed(w, r, "list", err)
		return
	}
	page := quotaPage{Quotas: []*quota.Wire{}}
	for i, q := range qs {
		if i == limit {
			page.Next = qs[i-1].APIKey
			break
		}
		page.Quotas = append(page.Quotas, q.ToWire())
	}
	writeAdminJSON(w, http.StatusOK, page)
}

func (a *admin) audit(w http.ResponseWriter, r *http.Request) {
	key, ok := pathKey(w, r)
	if !ok {
		return
	}
	es, err := a.cfg.Store.Audit(r.Context(), key, maxPageSize)
	if err != nil {
		a.storeFailed(w, r, "audit", err)
		return
	}
	if es == nil {
		es = []quota.AuditEntry{}
	}
	writeAdminJSON(w, http.StatusOK, map[string]any{"api_key": key, "entries": es})
}

// usageReport is GET /admin/v1/usage/{api_key}'s answer.
type usageReport struct {
	APIKey string       `json:"api_key"`
	Quota  *quota.Wire  `json:"quota"`
	Usage  []limitUsage `json:"usage"`
}

// limitUsage is one limit's usage.
type limitUsage struct {
	Domain     string `json:"domain"`
	Descriptor string `json:"descriptor"`
	Name       string `json:"name"`
	Tier       string `json:"tier,omitempty"`
	Scope      string `json:"scope"`
	Unit       string `json:"unit"`
	Limit      int64  `json:"limit"`
	Overridden bool   `json:"overridden"`
	Used       int64  `json:"used"`
	Remaining  int64  `json:"remaining"`
	// ResetSeconds is the time until the window ends, rounded up.
	ResetSeconds int64 `json:"reset_seconds"`
}

func (a *admin) usage(w http.ResponseWriter, r *http.Request) {
	key, ok := pathKey(w, r)
	if !ok {
		return
	}
	rep := usageReport{APIKey: key, Usage: []limitUsage{}}
	q, err := a.cfg.Store.Get(r.Context(), key)
	switch {
	case err == nil:
		rep.Quota = q.ToWire()
	case errors.Is(err, quota.ErrNotFound):
	default:
		// The store is down: usage still answers from the counts.
		a.cfg.Logger.Warn("admin: usage without the quota store", "api_key", key, "err", err)
	}
	wantDomain := r.URL.Query().Get("domain")
	var domains []string
	for _, d := range a.cfg.Engine.Rules().Domains() {
		if d.Tenants != nil && (wantDomain == "" || d.Name == wantDomain) {
			domains = append(domains, d.Name)
		}
	}
	if wantDomain != "" && len(domains) == 0 {
		adminFailed(w, &quota.FieldError{Field: "domain", Msg: fmt.Sprintf("%q is not a domain of the rules with a tenants section", wantDomain)})
		return
	}
	slices.Sort(domains)
	now := a.cfg.Now()
	for _, dn := range domains {
		us, err := a.cfg.Engine.UsageAt(r.Context(), now, dn, key)
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return
			}
			adminFailed(w, err)
			return
		}
		for _, u := range us {
			rep.Usage = append(rep.Usage, limitUsage{
				Domain: dn, Descriptor: pop.Descriptor{Entries: u.Descriptor}.Describe(), Name: u.Limit.Name, Tier: u.Tier,
				Scope: u.Limit.Scope.String(), Unit: u.Limit.Unit.String(), Limit: u.Limit.Spec.Limit,
				Overridden: q != nil && q.Override(u.Limit.Name) != nil,
				Used:       u.Used, Remaining: u.Remaining, ResetSeconds: seconds(u.Reset),
			})
		}
	}
	writeAdminJSON(w, http.StatusOK, rep)
}

func (a *admin) openapi(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, openAPIDoc)
}

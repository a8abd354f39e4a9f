package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/pop/rules"
)

// Status is one PoP's state as GET /status shows it to an operator: who it
// is, whether it can answer, its store, its rules, its replication and its
// traffic. Config.Status makes one per request; nothing in it is read on the
// check path.
type Status struct {
	PoP     string    `json:"pop,omitempty"`    // --pop; empty when not replicating
	Region  string    `json:"region,omitempty"` // --region
	Listen  string    `json:"listen"`
	Version string    `json:"version"`
	Started time.Time `json:"started"`
	Now     time.Time `json:"now"`
	// UptimeSeconds is Now − Started.
	UptimeSeconds float64 `json:"uptime_seconds"`
	// Ready is what /readyz answers; NotReady its reason when it fails.
	Ready    bool               `json:"ready"`
	NotReady string             `json:"not_ready,omitempty"`
	Store    StoreStatus        `json:"store"`
	Rules    RulesStatus        `json:"rules"`
	Repl     *ReplicationStatus `json:"replication,omitempty"` // nil: the PoP does not replicate
	Traffic  TrafficStatus      `json:"traffic"`
	// Top are the most limited keys (GET /v1/top's first statusTopKeys),
	// filled in by the server; nil when /v1/top is not served (no sketch,
	// or HideMitigations: they are key values, possibly API keys).
	Top *TopStatus `json:"top_limited_keys,omitempty"`
}

// TopStatus is the most limited keys since start, most denied first.
type TopStatus struct {
	Total uint64   `json:"total"` // every denial counted
	Keys  []TopKey `json:"keys"`
}

// TopKey is one of them: its denials, at most Error above the truth.
type TopKey struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
}

// StoreStatus is the counter store.
type StoreStatus struct {
	Kind    string `json:"kind"`              // embedded or redis
	Address string `json:"address,omitempty"` // Redis's URL, without its password
	// Reachable is false while Redis does not answer its probes (or refuses
	// the credentials); Error says why, since FailingSince.
	Reachable    bool       `json:"reachable"`
	Error        string     `json:"error,omitempty"`
	FailingSince *time.Time `json:"failing_since,omitempty"`
	// Breaker is the circuit breaker in front of Redis: closed (Redis
	// decides), open (the embedded store decides) or half-open (probing).
	Breaker string `json:"breaker,omitempty"`
	// FallbackDecisions are the checks decided without Redis since start.
	FallbackDecisions uint64 `json:"fallback_decisions,omitempty"`
	// Keys are the keys of the embedded store's table, edgelimit_store_keys
	// (with Redis, its fallback's).
	Keys int `json:"keys"`
}

// RulesStatus is the rules in force and the latest load of the files.
type RulesStatus struct {
	Files   []string `json:"files"`
	Domains int      `json:"domains"`
	Limits  int      `json:"limits"`
	// Version names the limits in force: PoPs showing the same one enforce
	// the same limits ("" if it could not be made).
	Version  string    `json:"version,omitempty"`
	LoadedAt time.Time `json:"loaded_at"` // when the rules in force were loaded
	Loads    uint64    `json:"loads"`     // successful loads since start, the first one included
	Failures uint64    `json:"failures"`  // failed reloads since start
	// LastError is the latest reload's error while the files on disk still
	// fail to load (the rules loaded at LoadedAt stay in force).
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
}

// ReplicationStatus is what the PoP hears of the others.
type ReplicationStatus struct {
	// NATS is the state of the PoP's connection to its region's NATS
	// servers (CONNECTED, RECONNECTING, …) and NATSURL the server it is on.
	NATS      string `json:"nats"`
	NATSURL   string `json:"nats_url,omitempty"`
	Connected bool   `json:"nats_connected"`
	// GlobalShare is the share of every global limit this PoP enforces: 1,
	// or less while other regions are unreachable.
	GlobalShare float64 `json:"global_share"`
	// Unreachable are the other regions no presence beacon came from within
	// --unreachable-after.
	Unreachable []string     `json:"unreachable_regions"`
	Peers       []PeerStatus `json:"peers"`
	// Problems are replication's reasons to fail /readyz (catching up,
	// stream misconfigured or full, …), empty when there are none.
	Problems []string `json:"problems,omitempty"`
	// LagP50Seconds and LagP99Seconds are the replication lag of the other
	// PoPs' delta batches applied recently, sender's build to this PoP's apply.
	// LagBatches is how many batches they were measured on (0: none yet).
	LagP50Seconds float64 `json:"lag_p50_seconds"`
	LagP99Seconds float64 `json:"lag_p99_seconds"`
	LagBatches    uint64  `json:"lag_batches"`
}

// PeerStatus is one other PoP of the topology and when it was last heard.
type PeerStatus struct {
	PoP    string `json:"pop"`
	Region string `json:"region"`
	// BeaconAgoSeconds is how long ago its last presence beacon arrived,
	// DataAgoSeconds its last counts (a delta batch or snapshot); nil when
	// never since this PoP started.
	BeaconAgoSeconds *float64 `json:"last_beacon_seconds_ago"`
	DataAgoSeconds   *float64 `json:"last_counts_seconds_ago"`
	// RegionUnreachable says its region counts as cut off.
	RegionUnreachable bool `json:"region_unreachable"`
}

// TrafficStatus is the PoP's recent traffic.
type TrafficStatus struct {
	// The rates are over the last RateSeconds (0 until a second has passed).
	RateSeconds        float64 `json:"rate_seconds"`
	RequestsPerSecond  float64 `json:"requests_per_second"`  // calls of the check APIs: check, batch, release, authz, /json, gRPC
	DecisionsPerSecond float64 `json:"decisions_per_second"` // limit decisions (a request may meet several limits)
	DeniedPerSecond    float64 `json:"denied_per_second"`    // decisions that denied, by the store or a mitigation bit
	// Totals since start.
	Requests  uint64 `json:"requests"`
	Decisions uint64 `json:"decisions"`
	Denied    uint64 `json:"denied"`
	Mitigated uint64 `json:"mitigated"` // of Denied, by a mitigation bit without asking the store
	// MitigationBits are the mitigation bits in force now.
	MitigationBits int `json:"mitigation_bits"`
}

// statusRefresh is how often the page reloads itself, in seconds.
const statusRefresh = 5

// statusTopKeys is how many of the most limited keys the page lists.
const statusTopKeys = 5

// handleStatus serves the status page: HTML for a browser, JSON for
// ?format=json or a client that accepts JSON and not HTML.
func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	st := s.cfg.Status()
	if s.cfg.TopKeys != nil && !s.cfg.HideMitigations && st.Top == nil {
		top := &TopStatus{Total: s.cfg.TopKeys.Total(), Keys: []TopKey{}}
		for _, e := range s.cfg.TopKeys.Top(statusTopKeys) {
			top.Keys = append(top.Keys, TopKey{Key: rules.DescribeKey(e.Key), Count: e.Count, Error: e.Err})
		}
		st.Top = top
	}
	w.Header().Set("Cache-Control", "no-store")
	if wantsJSON(r) {
		b, err := json.MarshalIndent(st, "", "  ")
		if err != nil {
			writeError(w, http.StatusInternalServerError, "INTERNAL", "", err.Error())
			return
		}
		writeJSON(w, http.StatusOK, append(b, '\n'))
		return
	}
	var b bytes.Buffer
	if err := statusPage.Execute(&b, st); err != nil {
		s.cfg.Logger.Error("status page", "err", err)
		writeError(w, http.StatusInternalServerError, "INTERNAL", "", "the status page failed to render; ?format=json has the same facts")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	// No script, no asset from anywhere: the page's own style only.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b.Bytes())
}

// handleRoot answers GET / with the way to the status page, and anything
// else under / with the API's JSON 404.
func (s *Server) handleRoot(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/" && s.cfg.Status != nil && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		http.Redirect(w, r, "/status", http.StatusFound)
		return
	}
	writeError(w, http.StatusNotFound, "NOT_FOUND", "", fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
}

// wantsJSON reports whether r asks for the status as JSON: ?format=json, or
// an Accept header that names application/json and not text/html.
func wantsJSON(r *http.Request) bool {
	switch r.URL.Query().Get("format") {
	case "json":
		return true
	case "html":
		return false
	}
	json, html := false, false
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil || params["q"] == "0" {
			continue
		}
		switch mt {
		case "application/json":
			json = true
		case "text/html", "application/xhtml+xml":
			html = true
		}
	}
	return json && !html
}

// humanSeconds renders a duration in seconds for a person: "0.4 s", "12 s",
// "3 min 5 s", "2 h 4 min", "3 d 2 h".
func humanSeconds(v float64) string {
	switch {
	case math.IsNaN(v) || v < 0:
		return "–"
	case v < 10:
		return strconv.FormatFloat(v, 'f', 1, 64) + " s"
	case v < 60:
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64) + " s"
	}
	d := time.Duration(v * float64(time.Second)).Round(time.Second)
	days, h, m, sec := d/(24*time.Hour), d%(24*time.Hour)/time.Hour, d%time.Hour/time.Minute, d%time.Minute/time.Second
	switch {
	case days > 0:
		return fmt.Sprintf("%d d %d h", days, h)
	case h > 0:
		return fmt.Sprintf("%d h %d min", h, m)
	}
	return fmt.Sprintf("%d min %d s", m, sec)
}

var statusFuncs = template.FuncMap{
	"secs": humanSeconds,
	"ago": func(v *float64) string {
		if v == nil {
			return "never"
		}
		return humanSeconds(*v) + " ago"
	},
	// stale: a peer not heard for three beacon intervals (of 500 ms) and more.
	"stale": func(v *float64) bool { return v == nil || *v > 1.5 },
	"rate": func(v float64) string {
		if v < 10 {
			return strconv.FormatFloat(v, 'f', 1, 64)
		}
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	},
	"pct":     func(v float64) string { return strconv.FormatFloat(100*v, 'f', -1, 64) + "%" },
	"ms":      func(v float64) string { return strconv.FormatFloat(v*1000, 'f', 1, 64) + " ms" },
	"when":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"refresh": func() int { return statusRefresh },
}

// statusPage is the page: one column of sections, no script, no asset
// loaded from anywhere, refreshed by the browser every statusRefresh seconds.
var statusPage = template.Must(template.New("status").Funcs(statusFuncs).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="refresh" content="{{refresh}}">
<title>edgelimit {{with .PoP}}{{.}}{{else}}PoP{{end}}{{with .Region}} ({{.}}){{end}}: {{if .Ready}}ready{{else}}not ready{{end}}</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; color: #222; margin: 1.5em auto; max-width: 60em; padding: 0 1em; }
h1 { font-size: 1.5em; margin: 0 0 0.1em; }
h3 { font-size: 1em; margin: 1.2em 0 0.3em; }
h2 { font-size: 1.1em; margin: 1.6em 0 0.4em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.sub { color: #555; margin: 0; }
.badge { display: inline-block; padding: 0.1em 0.6em; border-radius: 0.8em; font-size: 0.8em; font-weight: 600; vertical-align: middle; }
.ok { background: #d9f2e0; color: #11602b; }
.bad { background: #fbe0dc; color: #8a1c0c; }
.warn { background: #fdf0c8; color: #6b4d00; }
table { border-collapse: collapse; }
th, td { text-align: left; padding: 0.2em 1.2em 0.2em 0; vertical-align: top; }
table.kv th { font-weight: normal; color: #555; white-space: nowrap; width: 15em; }
table.grid th { border-bottom: 1px solid #bbb; font-weight: 600; }
table.grid td { border-bottom: 1px solid #eee; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, .mono { font-family: ui-monospace, monospace; font-size: 0.92em; }
.err { color: #8a1c0c; }
footer { margin-top: 2em; color: #666; font-size: 0.9em; }
</style>
</head>
<body>
<h1>edgelimit {{with .PoP}}PoP {{.}}{{else}}PoP{{end}}{{with .Region}} <span class="sub">in region {{.}}</span>{{end}}
{{if .Ready}}<span class="badge ok">ready</span>{{else}}<span class="badge bad">not ready</span>{{end}}</h1>
<p class="sub">{{.Version}} · listening on <span class="mono">{{.Listen}}</span> · up {{secs .UptimeSeconds}} (since {{when .Started}}) · as of {{when .Now}}</p>
{{if not .Ready}}<p class="err">/readyz fails: {{.NotReady}}</p>{{end}}

<h2>Traffic</h2>
<table class="kv">
<tr><th>requests</th><td>{{rate .Traffic.RequestsPerSecond}}/s{{if .Traffic.RateSeconds}} over the last {{secs .Traffic.RateSeconds}}{{end}} · {{.Traffic.Requests}} since start</td></tr>
<tr><th>limit decisions</th><td>{{rate .Traffic.DecisionsPerSecond}}/s · {{.Traffic.Decisions}} since start</td></tr>
<tr><th>denials</th><td>{{rate .Traffic.DeniedPerSecond}}/s · {{.Traffic.Denied}} since start{{if .Traffic.Mitigated}}, {{.Traffic.Mitigated}} of them by a mitigation bit{{end}}</td></tr>
<tr><th>mitigation bits in force</th><td>{{.Traffic.MitigationBits}}</td></tr>
</table>
{{with .Top}}<h3>Most limited keys</h3>
{{if .Keys}}<table class="grid">
<tr><th>key</th><th>denials since start</th></tr>
{{range .Keys}}<tr><td class="mono">{{.Key}}</td><td class="num">{{.Count}}{{if .Error}} (at most {{.Error}} fewer){{end}}</td></tr>
{{end}}</table>
<p class="sub">Of {{.Total}} denials counted; <a href="/v1/top?n=50">/v1/top</a> lists more.</p>{{else}}<p class="sub">No key denied since start.</p>{{end}}{{end}}

<h2>Store</h2>
<table class="kv">
<tr><th>counter store</th><td>{{.Store.Kind}}{{with .Store.Address}} <span class="mono">{{.}}</span>{{end}}
{{if eq .Store.Kind "redis"}}{{if .Store.Reachable}}<span class="badge ok">reachable</span>{{else}}<span class="badge bad">unreachable</span>{{end}}{{end}}</td></tr>
{{with .Store.Error}}<tr><th>failing</th><td class="err">{{.}}{{with $.Store.FailingSince}} (since {{when .}}){{end}}</td></tr>{{end}}
{{with .Store.Breaker}}<tr><th>circuit breaker</th><td>{{.}}{{if eq . "closed"}} (Redis decides){{else if eq . "open"}} <span class="badge warn">fallback</span> the embedded store decides{{else}} (probing Redis){{end}}</td></tr>{{end}}
{{if eq .Store.Kind "redis"}}<tr><th>decided without Redis</th><td>{{.Store.FallbackDecisions}} checks since start</td></tr>{{end}}
<tr><th>keys in the embedded table</th><td>{{.Store.Keys}} ({{if eq .Store.Kind "redis"}}the fallback's, {{end}}edgelimit_store_keys){{if .Repl}}: limits of scope pop; replication keeps the counts of region and global limits{{end}}</td></tr>
</table>

<h2>Rules</h2>
<table class="kv">
<tr><th>in force</th><td>{{.Rules.Limits}} limit{{if ne .Rules.Limits 1}}s{{end}} in {{.Rules.Domains}} domain{{if ne .Rules.Domains 1}}s{{end}}, loaded {{when .Rules.LoadedAt}}</td></tr>
{{with .Rules.Version}}<tr><th>version</th><td><span class="mono">{{.}}</span> (the same at every PoP that enforces the same limits)</td></tr>{{end}}
<tr><th>files</th><td>{{range $i, $f := .Rules.Files}}{{if $i}}, {{end}}<span class="mono">{{$f}}</span>{{end}}</td></tr>
<tr><th>loads</th><td>{{.Rules.Loads}} ok, {{.Rules.Failures}} failed since start</td></tr>
<tr><th>last reload</th><td>{{if .Rules.LastError}}<span class="badge bad">failed</span> <span class="err">{{.Rules.LastError}}</span>{{with .Rules.LastErrorAt}} ({{when .}}){{end}}; the rules above stay in force{{else}}<span class="badge ok">ok</span>{{end}}</td></tr>
</table>

<h2>Replication</h2>
{{with .Repl}}<table class="kv">
<tr><th>NATS</th><td>{{if .Connected}}<span class="badge ok">{{.NATS}}</span>{{else}}<span class="badge bad">{{.NATS}}</span>{{end}}{{with .NATSURL}} <span class="mono">{{.}}</span>{{end}}</td></tr>
<tr><th>global share</th><td>{{pct .GlobalShare}}{{if lt .GlobalShare 1.0}} <span class="badge warn">partitioned</span> global limits are scaled down while regions are cut off{{end}}</td></tr>
<tr><th>unreachable regions</th><td>{{range $i, $r := .Unreachable}}{{if $i}}, {{end}}<span class="err">{{$r}}</span>{{else}}none{{end}}</td></tr>
<tr><th>lag</th><td>{{if .LagBatches}}p50 {{ms .LagP50Seconds}}, p99 {{ms .LagP99Seconds}} (another PoP's delta batch built to applied here){{else}}no delta batch applied yet{{end}}</td></tr>
{{range .Problems}}<tr><th>problem</th><td class="err">{{.}}</td></tr>{{end}}
</table>
{{if .Peers}}<table class="grid">
<tr><th>PoP</th><th>region</th><th>last beacon</th><th>last counts or bits</th><th></th></tr>
{{range .Peers}}<tr><td class="mono">{{.PoP}}</td><td>{{.Region}}</td><td>{{ago .BeaconAgoSeconds}}</td><td>{{ago .DataAgoSeconds}}</td>
<td>{{if .RegionUnreachable}}<span class="badge bad">region cut off</span>{{else if stale .BeaconAgoSeconds}}<span class="badge warn">not heard</span>{{else}}<span class="badge ok">heard</span>{{end}}</td></tr>
{{end}}</table>{{else}}<p>This PoP is alone in its topology.</p>{{end}}
{{else}}<p>Off: this PoP runs without <code>--region</code> and <code>--pop</code>, so every limit counts its hits alone.</p>{{end}}

<footer>Refreshes every {{refresh}} s. The same facts as JSON: <a href="/status?format=json">/status?format=json</a>.
Also: <a href="/readyz">/readyz</a> · <a href="/healthz">/healthz</a> · <a href="/metrics">/metrics</a>.</footer>
</body>
</html>
`))

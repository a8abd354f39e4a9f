package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab/faultnet"
	"github.com/edgelimit/edgelimit/pop/loadgen"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// Passwords the lab's NATS servers and PoPs use, as an operator would make
// them (letters and digits; see deploy/nats/hub-region.conf).
const (
	probePassword = "labProbe4Secret1"
	sysPassword   = "labSys5Secret2"
)

// Domain and Key are the rate-limit domain and descriptor key of the lab's
// one rule; every load sends the value "hot".
const (
	Domain = "lab"
	Key    = "api_key"
)

// durableKey is the descriptor key of the lab's hour-long limit of
// durableLimit, which the faults use.
const (
	durableKey   = "durable"
	durableLimit = 1000
)

// Config is one lab run.
type Config struct {
	Plan Plan
	// Root is the repository's root: the lab runs deploy/nats/*.conf and
	// deploy/systemd/pop.yaml from there.
	Root string
	// Edgelimit and NATSServer are the binaries (NATSServer of the version
	// go.mod names; see Build); RedisServer is redis-server, needed when the
	// plan's layout has Redis PoPs.
	Edgelimit, NATSServer, RedisServer string
	// Dir holds the run's configs, data and logs; it is kept.
	Dir string
	// Log receives a line per step; nil for none.
	Log io.Writer
	// Faults adds, after the scenario, a PoP killed with kill -9 and
	// restarted, and a hub NATS server stopped.
	Faults bool
	// Prometheus, when set, is the prometheus binary: the lab runs it with
	// deploy/prometheus's files, evaluates the Grafana dashboard's queries
	// at the end, and — with AlertPhase — cuts a region until the partition
	// alert fires, heals it, and waits for the alert to resolve.
	Prometheus string
	AlertPhase bool
	// Shapes are the traffic shapes (Shapes) run after the scenario, each
	// once, on the shapes' global limit of consistency Consistency
	// (eventual when ""; bounded only on a layout of embedded PoPs).
	Shapes      []string
	Consistency string
	// AlternateGap is how long the alternating client waits after each
	// answer: a client's round trip to a PoP, which the lab's own link to
	// the PoPs does not have (0: back to back, the 100 checks over in a few
	// ms, before any news crosses a region).
	AlternateGap time.Duration
	// PoPEnv is added to every PoP's environment: the place for per-PoP
	// credentials (EDGELIMIT_NATS_CREDS, …) once the configs take them.
	PoPEnv func(pop string) []string
}

// lab is a running lab.
type lab struct {
	cfg    Config
	plan   Plan
	mu     sync.Mutex
	procs  map[string]*Proc // by host name; loads by "load-"+PoP+source
	popArg map[string][]string
	relays []*faultnet.Proxy
	// promAddr is the lab's Prometheus, host:port, once it runs.
	promAddr string
	client   *http.Client
}

func (l *lab) logf(format string, args ...any) {
	if l.cfg.Log != nil {
		fmt.Fprintf(l.cfg.Log, "lab: "+format+"\n", args...)
	}
}

// Run brings the plan's sites up, runs the scenario's traffic and cuts,
// the faults if asked, tears everything down — also on error or when ctx
// ends — and returns what it measured. It needs root.
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	if os.Geteuid() != 0 {
		return Report{}, errors.New("lab: needs root (ip netns)")
	}
	if err := BoundedOn(cfg.Plan.Layout, cfg.shapeConsistency()); err != nil {
		return Report{}, err
	}
	began := time.Now()
	l := &lab{cfg: cfg, plan: cfg.Plan, procs: map[string]*Proc{}, popArg: map[string][]string{},
		client: &http.Client{Timeout: 2 * time.Second}}
	if left := Leftovers(); len(left) > 0 {
		l.logf("removing what an earlier run left: %s", strings.Join(left, ", "))
		if err := Teardown(); err != nil {
			return Report{}, err
		}
	}
	defer func() {
		l.stopAll()
		terr := Teardown()
		if left := Leftovers(); len(left) > 0 {
			terr = errors.Join(terr, fmt.Errorf("lab: left behind: %s", strings.Join(left, ", ")))
		}
		if err == nil {
			err = terr
		}
		rep.Wall = time.Since(began)
		l.logf("torn down (%v)", rep.Wall.Round(time.Second))
	}()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return Report{}, err
	}
	l.logf("network: %d regions, namespaces under %s-*", len(l.plan.Regions), Prefix)
	if err := setupNetwork(l.plan); err != nil {
		return Report{}, err
	}
	if err := l.startRelays(); err != nil {
		return Report{}, err
	}
	if err := l.startNATS(ctx); err != nil {
		return Report{}, err
	}
	if err := l.startRedis(ctx); err != nil {
		return Report{}, err
	}
	if err := l.startPoPs(ctx); err != nil {
		return Report{}, err
	}
	if cfg.Prometheus != "" {
		if err := l.startPrometheus(ctx); err != nil {
			return Report{}, err
		}
	}
	rep, err = l.runScenario(ctx)
	if err != nil {
		return rep, err
	}
	if len(cfg.Shapes) > 0 {
		if rep.Shapes, err = l.runShapes(ctx); err != nil {
			return rep, err
		}
	}
	if cfg.Faults {
		rep.Faults = l.runFaults(ctx)
	}
	if cfg.Prometheus != "" && cfg.AlertPhase {
		a := l.alertPhase(ctx)
		rep.Alert = &a
	}
	if cfg.Prometheus != "" {
		if rep.Dashboard, err = l.evalDashboard(); err != nil {
			return rep, err
		}
	}
	return rep, ctx.Err()
}

// stopAll kills every process the lab started.
func (l *lab) stopAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.procs {
		if !p.Exited() {
			p.Kill()
		}
	}
	for _, r := range l.relays {
		r.Close()
	}
}

func (l *lab) start(h Host, name string, env []string, bin string, args ...string) (*Proc, error) {
	p, err := StartProc(l.cfg.Dir, h.NS, name, env, bin, args...)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.procs[name] = p
	l.mu.Unlock()
	return p, nil
}

// startRelays puts a relay on every link between a leaf region and a hub
// server, dialing from the hub's wan address, and on every direct path's
// (PoP, other region's server), dialing from that region's wan address:
// the address its hosts route back to over its own wan link (as a leaf
// link's relay dials the hub), so that a cut of either region's link cuts
// the direct path too. Every relay has its own seed.
func (l *lab) startRelays() error {
	hub := l.plan.Regions[0]
	seed := l.plan.Scenario.Seed
	for _, lp := range l.plan.Links {
		if err := l.relay(lp.Listen, lp.Target, wanIP(hub.Index, false), seed, lp.Link); err != nil {
			return err
		}
		seed++
	}
	for _, d := range l.plan.Direct {
		to, _ := l.plan.Region(d.To)
		if err := l.relay(d.Listen, d.Target, wanIP(to.Index, false), seed, d.Link); err != nil {
			return err
		}
		seed++
	}
	if len(l.plan.Direct) > 0 {
		l.logf("%d relays for the PoPs' direct paths (--nats-direct)", len(l.plan.Direct))
	}
	return nil
}

// relay starts one relay from listen to target, dialing from local.
func (l *lab) relay(listen, target, local string, seed uint64, link faultnet.Link) error {
	p, err := faultnet.Listen(listen, target, faultnet.Options{Seed: seed, LocalAddr: local})
	if err != nil {
		return fmt.Errorf("lab: relay %s → %s: %w", listen, target, err)
	}
	l.relays = append(l.relays, p)
	return p.SetLink(link)
}

// startNATS starts every region's servers from deploy/nats as an operator
// would (values from the environment; only the store directory
// replaced), the hub first, and waits until every leaf region reaches the
// hub's JetStream domain and back.
// keysDir is where natsKeys writes the PoPs' NATS credentials.
func (l *lab) keysDir() string { return filepath.Join(l.cfg.Dir, "keys") }

// natsKeys writes one NATS nkey per PoP and the servers' accounts with
// edgelimit natsconf, as an operator does (deploy/nats/README.md), and adds
// the user the lab probes JetStream domains with: the PoPs' own permissions
// do not reach other domains' APIs. It returns the accounts file's text.
func (l *lab) natsKeys() (string, error) {
	if out, err := exec.Command(l.cfg.Edgelimit, "natsconf", "--topology", l.plan.Topology, "--keys", l.keysDir()).CombinedOutput(); err != nil {
		return "", fmt.Errorf("edgelimit natsconf: %v: %s", err, out)
	}
	path := filepath.Join(l.keysDir(), "edgelimit-accounts.conf")
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return Replace(path, string(b), "    users: [\n", "    users: [\n      { user: probe, password: "+probePassword+" }\n")
}

// natsTLS makes the certificates of the leaf links between sites, as an
// operator's CA would (deploy/README.md, "TLS between sites"): one server
// certificate, also used as the client one a hub verifies, naming every
// address a leaf link is dialled at — each region's relay on its wan side —
// and every server's own. It returns the NATS_TLS_* environment.
func (l *lab) natsTLS() ([]string, error) {
	var ips []net.IP
	for _, r := range l.plan.Regions {
		ips = append(ips, net.ParseIP(wanIP(r.Index, false)))
		for _, s := range r.NATS {
			ips = append(ips, net.ParseIP(s.IP))
		}
	}
	dir := filepath.Join(l.cfg.Dir, "tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p, err := natstest.WritePKI(dir, ips, 24*time.Hour)
	if err != nil {
		return nil, fmt.Errorf("lab: certificates for the leaf links: %w", err)
	}
	return []string{"NATS_TLS_CERT=" + p.ServerCert, "NATS_TLS_KEY=" + p.ServerKey, "NATS_TLS_CA=" + p.CAFile}, nil
}

func (l *lab) startNATS(ctx context.Context) error {
	hub := l.plan.Regions[0]
	accounts, err := l.natsKeys()
	if err != nil {
		return err
	}
	tlsEnv, err := l.natsTLS()
	if err != nil {
		return err
	}
	hubKey, err := LeafEnv(l.keysDir())
	if err != nil {
		return err
	}
	for ri, r := range l.plan.Regions {
		conf := "leaf-region.conf"
		if ri == 0 {
			conf = "hub-region.conf"
		}
		path := filepath.Join(l.cfg.Root, "deploy", "nats", conf)
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for k, s := range r.NATS {
			dir := filepath.Join(l.cfg.Dir, s.Name)
			if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, "keys", "edgelimit-accounts.conf"), []byte(accounts), 0o644); err != nil {
				return err
			}
			// The leaf links' tls lines uncommented, as the files tell an
			// operator to for links between sites.
			text, err := Replace(path, string(b),
				"store_dir: /var/lib/nats/jetstream", "store_dir: "+filepath.Join(dir, "jetstream"),
				"# tls { cert_file: $NATS_TLS_CERT", "tls { cert_file: $NATS_TLS_CERT")
			if err != nil {
				return err
			}
			env := append([]string{"NATS_SERVER_NAME=" + s.Name, "EDGELIMIT_REGION=" + r.Name, "NATS_SYS_PASSWORD=" + sysPassword}, tlsEnv...)
			for i, o := range r.NATS {
				env = append(env, fmt.Sprintf("NATS_ROUTE_%d=nats-route://%s:6222", i+1, o.IP))
			}
			if ri == 0 {
				env = append(env, hubKey)
			} else {
				// The relays on this region's wan address, one per hub server.
				w := wanIP(r.Index, false)
				if err := LeafRemote(l.keysDir(), dir); err != nil {
					return err
				}
				env = append(env,
					fmt.Sprintf("EDGELIMIT_HUB_URL=nats-leaf://%s:%d", w, natsLeafPort),
					fmt.Sprintf("EDGELIMIT_HUB_URL_2=nats-leaf://%s:%d", w, natsLeafPort+1),
					fmt.Sprintf("EDGELIMIT_HUB_URL_3=nats-leaf://%s:%d", w, natsLeafPort+2))
			}
			if err := CheckEnv(path, text, env); err != nil {
				return err
			}
			file := filepath.Join(dir, conf)
			if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
				return err
			}
			if _, err := l.start(s, s.Name, env, l.cfg.NATSServer, "-c", file); err != nil {
				return err
			}
			_ = k
		}
		for _, s := range r.NATS {
			if err := l.waitFor(ctx, 30*time.Second, s.Name+" JetStream", func() error {
				return l.alive(s.Name, func() error { return domainIs(s, "", r.Name) })
			}); err != nil {
				return err
			}
		}
		l.logf("region %s: %d NATS servers up (%s)", r.Name, len(r.NATS), conf)
	}
	// A stream source requested across a link not yet up is retried only
	// after 30 s: wait for every link both ways before any PoP starts.
	for _, r := range l.plan.Regions[1:] {
		for _, s := range r.NATS {
			if err := l.waitFor(ctx, 30*time.Second, s.Name+" reaches domain "+hub.Name, func() error {
				return domainIs(s, hub.Name, hub.Name)
			}); err != nil {
				return err
			}
		}
		for _, s := range hub.NATS {
			if err := l.waitFor(ctx, 30*time.Second, s.Name+" reaches domain "+r.Name, func() error {
				return domainIs(s, r.Name, r.Name)
			}); err != nil {
				return err
			}
		}
	}
	l.logf("leaf links up through the relays, over TLS")
	return nil
}

// domainIs checks that JetStream domain want answers through server s
// (via "" asks for s's own).
func domainIs(s Host, via, want string) error {
	got, err := JetStreamDomain(fmt.Sprintf("nats://%s:%d", s.IP, natsClientPort), "probe", probePassword, via)
	if err == nil && got != want {
		err = fmt.Errorf("answered by domain %q, want %q", got, want)
	}
	return err
}

// alive returns check's error, or a fatal one when process name has exited.
func (l *lab) alive(name string, check func() error) error {
	l.mu.Lock()
	p := l.procs[name]
	l.mu.Unlock()
	if p != nil && p.Exited() {
		return &fatal{fmt.Errorf("%s exited: %s", name, p.Tail(2000))}
	}
	return check()
}

// fatal is an error waitFor does not retry.
type fatal struct{ error }

// waitFor polls cond every 100 ms until it returns nil, a fatal error, ctx
// ends or timeout passes.
func (l *lab) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		var f *fatal
		if errors.As(err, &f) {
			return fmt.Errorf("lab: %s: %w", what, f.error)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab: %s: not after %v: %w", what, timeout, err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// rulesFile writes the lab's one rule: the scenario's limit, global.
func (l *lab) rulesFile() (string, error) {
	lim := l.plan.Scenario.Limit
	text := fmt.Sprintf(`# The lab's rules: the scenario's limit, global across every PoP, an
# hour-long one the faults use to see a PoP keep its counts across kill -9,
# and the traffic shapes' (one key value per shape).
domain: %s
descriptors:
  - key: %s
    rate_limit: {unit: %s, requests_per_unit: %d, algorithm: %s, scope: global}
  - key: %s
    rate_limit: {unit: hour, requests_per_unit: %d, scope: global}
  - key: %s
    rate_limit: {unit: hour, requests_per_unit: %d, scope: global, consistency: %s}
`, Domain, Key, lim.Unit, lim.RequestsPerUnit, lim.Algorithm, durableKey, durableLimit, ShapeKey, ShapeLimit, l.cfg.shapeConsistency())
	path := filepath.Join(l.cfg.Dir, "rules.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return "", err
	}
	if _, _, err := rules.Load(path); err != nil {
		return "", fmt.Errorf("lab: the rule made from the scenario's limit: %w", err)
	}
	return path, nil
}

// startPoPs starts every PoP from deploy/systemd/pop.yaml, the values that
// differ per PoP on its command line (which wins over the file), and waits
// until each is ready and hears every region.
func (l *lab) startPoPs(ctx context.Context) error {
	rulesPath, err := l.rulesFile()
	if err != nil {
		return err
	}
	sc := l.plan.Scenario
	popYAML := filepath.Join(l.cfg.Root, "deploy", "systemd", "pop.yaml")
	for _, r := range l.plan.Regions {
		var urls []string
		for _, s := range r.NATS {
			urls = append(urls, fmt.Sprintf("nats://%s:%d", s.IP, natsClientPort))
		}
		for _, h := range r.PoPs {
			store := "embedded"
			if h.Redis != "" {
				store = "redis://" + h.Redis
			}
			args := []string{"pop", "--config", popYAML, "--rules", rulesPath,
				"--data", filepath.Join(l.cfg.Dir, h.Name), "--store", store,
				"--region", r.Name, "--pop", h.PoP, "--topology", l.plan.Topology,
				"--nats", strings.Join(urls, ","), "--nats-nkey", filepath.Join(l.keysDir(), h.PoP+".nk"),
				"--flush-interval", sc.FlushInterval.String(), "--snapshot-interval", sc.SnapshotInterval.String(),
				"--unreachable-after", sc.UnreachableAfter.String(),
				"--partition-share", strconv.FormatFloat(sc.PartitionShare, 'g', -1, 64)}
			if sc.BitsInterval > 0 {
				args = append(args, "--urgent-interval", sc.BitsInterval.String())
			}
			if d := l.plan.DirectFlag(h.Name); d != "" {
				args = append(args, "--nats-direct", d)
			}
			l.popArg[h.Name] = args
			if err := l.startPoP(h); err != nil {
				return err
			}
		}
	}
	for _, r := range l.plan.Regions {
		for _, h := range r.PoPs {
			if err := l.waitFor(ctx, 60*time.Second, h.Name+" ready", l.ready(h)); err != nil {
				return err
			}
		}
	}
	for _, h := range l.pops() {
		if err := l.waitFor(ctx, 60*time.Second, h.Name+" hears every region", func() error {
			m, err := l.scrape(h)
			if err != nil {
				return err
			}
			if v := m.get("edgelimit_global_share"); v != 1 {
				return fmt.Errorf("global share %v", v)
			}
			if v := m.get("edgelimit_replication_stalled_sources"); v != 0 {
				return fmt.Errorf("stalled sources %v", v)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	l.logf("%d PoP servers ready (%s), every one hearing every region", len(l.pops()), l.plan.Layout)
	return nil
}

// startRedis starts the redis-server of every Redis PoP, as deploy/compose.yaml
// runs it (no persistence), on its own host, and waits until each answers.
func (l *lab) startRedis(ctx context.Context) error {
	var hosts []Host
	for _, r := range l.plan.Regions {
		hosts = append(hosts, r.Redis...)
	}
	if len(hosts) == 0 {
		return nil
	}
	if l.cfg.RedisServer == "" {
		return fmt.Errorf("lab: the %s layout needs redis-server (Config.RedisServer; not found on PATH)", l.plan.Layout.Store)
	}
	for _, h := range hosts {
		if _, err := l.start(h, h.Name, nil, l.cfg.RedisServer, "--bind", h.IP, "--port", strconv.Itoa(redisPort),
			"--save", "", "--appendonly", "no", "--protected-mode", "no"); err != nil {
			return err
		}
	}
	for _, h := range hosts {
		if err := l.waitFor(ctx, 30*time.Second, h.Name+" answers PING", func() error {
			return l.alive(h.Name, func() error { return redisPing(fmt.Sprintf("%s:%d", h.IP, redisPort)) })
		}); err != nil {
			return err
		}
	}
	l.logf("%d redis-servers up, one per Redis PoP", len(hosts))
	return nil
}

// redisPing sends PING to the redis-server at addr and wants PONG.
func redisPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return err
	}
	b := make([]byte, 7)
	n, err := io.ReadAtLeast(c, b, 7)
	if err != nil || string(b[:n]) != "+PONG\r\n" {
		return fmt.Errorf("PING: %q, %v", b[:n], err)
	}
	return nil
}

func (l *lab) startPoP(h Host) error {
	var env []string
	if l.cfg.PoPEnv != nil {
		env = append(env, l.cfg.PoPEnv(h.Name)...)
	}
	_, err := l.start(h, h.Name, env, l.cfg.Edgelimit, l.popArg[h.Name]...)
	return err
}

// ready checks h's /readyz.
func (l *lab) ready(h Host) func() error {
	return func() error {
		return l.alive(h.Name, func() error {
			resp, err := l.client.Get(fmt.Sprintf("http://%s:%d/readyz", h.IP, popPort))
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("/readyz: %s", resp.Status)
			}
			return nil
		})
	}
}

// popCount is the number of PoPs (not servers).
func (l *lab) popCount() int {
	seen := map[string]bool{}
	for _, h := range l.pops() {
		seen[h.PoP] = true
	}
	return len(seen)
}

// pops lists every PoP server's host, region by region.
func (l *lab) pops() []Host {
	var out []Host
	for _, r := range l.plan.Regions {
		out = append(out, r.PoPs...)
	}
	return out
}

// metrics is a scraped exposition: sample lines by name{labels}.
type metrics map[string]float64

// get returns the sample name (with its labels exactly as exposed, e.g.
// `x{quantile="0.5"}`), NaN-free: -1 when absent.
func (m metrics) get(name string) float64 {
	if v, ok := m[name]; ok {
		return v
	}
	return -1
}

// scrape reads h's /metrics.
func (l *lab) scrape(h Host) (metrics, error) {
	resp, err := l.client.Get(fmt.Sprintf("http://%s:%d/metrics", h.IP, popPort))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	m := metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m, sc.Err()
}

// readLoad parses the JSON report a load printed to its log.
func readLoad(p *Proc) (loadgen.Report, error) {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return loadgen.Report{}, err
	}
	i := strings.IndexByte(string(b), '{')
	if i < 0 {
		return loadgen.Report{}, fmt.Errorf("%s printed no report: %s", p.Name, p.Tail(1000))
	}
	var rep loadgen.Report
	if err := json.Unmarshal(b[i:], &rep); err != nil {
		return loadgen.Report{}, fmt.Errorf("%s's report: %w", p.Name, err)
	}
	return rep, nil
}

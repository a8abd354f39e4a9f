// Package soak runs edgelimit under mixed load and faults on real processes
// on loopback — 2 regions × 2 PoPs, a nats-server per region linked as
// deploy/nats shows, one redis-server used by one PoP of each region — and
// checks a ledger of every decision against the bounds the docs state
// (deploy/soak/README.md). It is a documented command (make soak),
// not part of CI.
package soak

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgelimit/edgelimit/deploy/lab"
)

// Config is one soak run.
type Config struct {
	Root       string        // the module's root (to build the binaries and read deploy/nats)
	Dir        string        // work directory: data, logs, decisions.csv
	Duration   time.Duration // load duration (10m)
	FaultEvery time.Duration // time between two faults (20s)
	Limit      int           // every class's limit per window (50)
	Window     time.Duration // every class's window (10s)
	HotKeys    int           // keys per class offered Overload × their limit (4)
	TailKeys   int           // keys per class offered half their limit or less (40)
	Overload   float64       // hot keys' offered load / limit (4)
	Seed       uint64
	// Faults is the cycle of faults made, one every FaultEvery (default
	// DefaultFaults; empty after defaults only if set to []string{}).
	Faults     []string
	Log        io.Writer
	Edgelimit  string // prebuilt binaries; built into Dir when empty
	NATSServer string
}

func (c *Config) defaults() {
	if c.Duration == 0 {
		c.Duration = 10 * time.Minute
	}
	if c.FaultEvery == 0 {
		c.FaultEvery = 20 * time.Second
	}
	if c.Limit == 0 {
		c.Limit = 50
	}
	if c.Window == 0 {
		c.Window = 10 * time.Second
	}
	if c.HotKeys == 0 {
		c.HotKeys = 4
	}
	if c.TailKeys == 0 {
		c.TailKeys = 40
	}
	if c.Overload == 0 {
		c.Overload = 4
	}
	if c.Faults == nil {
		c.Faults = DefaultFaults
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
}

// The PoPs' timing flags (the documented defaults, named so the ledger's
// bounds use the same values).
const (
	flushInterval    = 100 * time.Millisecond
	snapshotInterval = 5 * time.Second
	breakerCooldown  = time.Second
	natsReconnect    = 2 * time.Second // nats.go's default reconnect wait
)

// FaultKinds are the faults the soak makes; DefaultFaults their cycle:
// in 10 minutes at one per 20 s, 15 PoP kills and 5 of each other kind.
var (
	FaultKinds    = []string{"pop-kill9", "redis-shutdown-nosave", "redis-kill9", "nats-restart"}
	DefaultFaults = []string{"pop-kill9", "redis-shutdown-nosave", "pop-kill9", "nats-restart", "pop-kill9", "redis-kill9"}
)

// Classes are the soak's limits: every scope, both replicable algorithms.
func Classes(limit int) []Class {
	var out []Class
	for _, scope := range []string{"pop", "region", "global"} {
		for _, alg := range []string{"sliding_window", "fixed_window"} {
			out = append(out, Class{Name: scope + "_" + alg[:1] + "w", Scope: scope, Algorithm: alg, Limit: limit})
		}
	}
	return out
}

// Topology is the soak's: eu (the NATS hub) and us, two PoPs each; eu-1 and
// us-2 count in Redis (db 0 and 1 of one redis-server), the others in the
// embedded store.
var Topology = []PoPInfo{
	{Name: "eu-1", Region: "eu", Redis: true},
	{Name: "eu-2", Region: "eu"},
	{Name: "us-1", Region: "us"},
	{Name: "us-2", Region: "us", Redis: true},
}

const topologyFlag = "eu=eu-1,eu-2;us=us-1,us-2"

func rulesYAML(classes []Class, window time.Duration) string {
	var b strings.Builder
	b.WriteString("domain: soak\ndescriptors:\n")
	for _, c := range classes {
		fmt.Fprintf(&b, "  - key: %s\n    rate_limit: {unit: second, unit_multiplier: %d, requests_per_unit: %d, scope: %s, algorithm: %s}\n",
			c.Name, int(window/time.Second), c.Limit, c.Scope, c.Algorithm)
	}
	return b.String()
}

type proc struct {
	name string
	bin  string
	args []string
	env  []string
	p    *lab.Proc
}

type soak struct {
	cfg     Config
	dir     string
	edge    string
	nats    string
	classes []Class

	mu       sync.Mutex
	pops     []*popProc
	natsSrv  map[string]*natsProc
	redis    *proc
	redisDir string
	redisAt  int
	count    map[string]int // faults made, by kind
}

type popProc struct {
	info PoPInfo
	addr string
	proc
}

type natsProc struct {
	region       string
	client, leaf int
	proc
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *soak) logf(format string, args ...any) {
	fmt.Fprintf(s.cfg.Log, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05.000")}, args...)...)
}

func (p *proc) start(dir string) error {
	// Keep the log of the process's earlier lives: name.log.1, .2, …
	log := filepath.Join(dir, p.name+".log")
	if _, err := os.Stat(log); err == nil {
		for i := 1; ; i++ {
			old := fmt.Sprintf("%s.%d", log, i)
			if _, err := os.Stat(old); err != nil {
				if err := os.Rename(log, old); err != nil {
					return err
				}
				break
			}
		}
	}
	np, err := lab.StartProc(dir, "", p.name, p.env, p.bin, p.args...)
	if err != nil {
		return err
	}
	p.p = np
	return nil
}

// waitUntil polls f every 50 ms until it returns nil or d passes.
func waitUntil(d time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %v: %w", what, d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func httpReady(addr string) error {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("readyz %d", resp.StatusCode)
	}
	return nil
}

func tcpUp(port int) error {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

const sysPassword = "sys5Soak2Ky"

var clusterBlock = regexp.MustCompile(`(?s)\ncluster \{.*?\n\}\n`)

// natsConfig writes deploy/nats/<conf> for one server alone on loopback:
// the file unchanged but for its listen addresses and store directory, and
// without its cluster block (one server per region here).
func (s *soak) natsConfig(n *natsProc, conf, keys string) (string, error) {
	b, err := os.ReadFile(filepath.Join(s.cfg.Root, "deploy/nats", conf))
	if err != nil {
		return "", err
	}
	dir := filepath.Join(s.dir, "nats-"+n.region)
	pairs := []string{
		"listen: 0.0.0.0:4222", fmt.Sprintf("listen: 127.0.0.1:%d", n.client),
		"store_dir: /var/lib/nats/jetstream", "store_dir: " + filepath.Join(dir, "jetstream"),
		"max_file_store: 10G", "max_file_store: 1G",
	}
	if n.leaf != 0 {
		pairs = append(pairs, "listen: 0.0.0.0:7422", fmt.Sprintf("listen: 127.0.0.1:%d", n.leaf))
	}
	text, err := lab.Replace(conf, string(b), pairs...)
	if err != nil {
		return "", err
	}
	if !clusterBlock.MatchString(text) {
		return "", fmt.Errorf("%s has no cluster block any more: update deploy/soak", conf)
	}
	text = clusterBlock.ReplaceAllString(text, "\n")
	if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o755); err != nil {
		return "", err
	}
	acc, err := os.ReadFile(filepath.Join(keys, "edgelimit-accounts.conf"))
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "keys", "edgelimit-accounts.conf"), acc, 0o644); err != nil {
		return "", err
	}
	file := filepath.Join(dir, conf)
	if err := lab.CheckEnv(conf, text, n.env); err != nil {
		return "", err
	}
	return file, os.WriteFile(file, []byte(text), 0o600)
}

func (s *soak) setup(ctx context.Context) error {
	cfg := s.cfg
	if cfg.Edgelimit == "" || cfg.NATSServer == "" {
		s.logf("building edgelimit and nats-server")
		e, n, err := lab.Build(ctx, cfg.Root, s.dir)
		if err != nil {
			return err
		}
		s.edge, s.nats = e, n
	} else {
		s.edge, s.nats = cfg.Edgelimit, cfg.NATSServer
	}
	keys := filepath.Join(s.dir, "keys")
	if out, err := exec.Command(s.edge, "natsconf", "--topology", topologyFlag, "--keys", keys).CombinedOutput(); err != nil {
		return fmt.Errorf("edgelimit natsconf: %v\n%s", err, out)
	}
	rules := filepath.Join(s.dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(rulesYAML(s.classes, cfg.Window)), 0o644); err != nil {
		return err
	}

	// Redis: RDB snapshots every second, so a kill -9 restarts it from a
	// snapshot up to a second old (lower counts), and SHUTDOWN NOSAVE with
	// the snapshot removed restarts it empty.
	port, err := freePort()
	if err != nil {
		return err
	}
	s.redisAt = port
	s.redisDir = filepath.Join(s.dir, "redis")
	if err := os.MkdirAll(s.redisDir, 0o755); err != nil {
		return err
	}
	s.redis = &proc{name: "redis", bin: "redis-server", args: []string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--dir", s.redisDir, "--save", "1 1", "--appendonly", "no", "--daemonize", "no"}}
	if err := s.startRedis(); err != nil {
		return err
	}

	// NATS: eu is the hub, us a leaf region linked to it with natsconf's
	// leaf.nk.
	hubKey, err := lab.LeafEnv(keys)
	if err != nil {
		return err
	}
	s.natsSrv = map[string]*natsProc{}
	for _, region := range []string{"eu", "us"} {
		n := &natsProc{region: region}
		if n.client, err = freePort(); err != nil {
			return err
		}
		conf := "leaf-region.conf"
		n.env = []string{"NATS_SERVER_NAME=nats-" + region, "EDGELIMIT_REGION=" + region, "NATS_SYS_PASSWORD=" + sysPassword}
		if region == "eu" {
			conf = "hub-region.conf"
			if n.leaf, err = freePort(); err != nil {
				return err
			}
			n.env = append(n.env, hubKey)
		} else {
			hub := s.natsSrv["eu"].leaf
			if err := lab.LeafRemote(keys, filepath.Join(s.dir, "nats-"+region)); err != nil {
				return err
			}
			n.env = append(n.env,
				fmt.Sprintf("EDGELIMIT_HUB_URL=nats-leaf://127.0.0.1:%d", hub),
				fmt.Sprintf("EDGELIMIT_HUB_URL_2=nats-leaf://127.0.0.1:%d", hub),
				fmt.Sprintf("EDGELIMIT_HUB_URL_3=nats-leaf://127.0.0.1:%d", hub))
		}
		file, err := s.natsConfig(n, conf, keys)
		if err != nil {
			return err
		}
		n.name, n.bin, n.args = "nats-"+region, s.nats, []string{"-c", file}
		s.natsSrv[region] = n
		if err := s.startNATS(n); err != nil {
			return err
		}
	}
	// A stream source requested across a leaf link not yet up is retried
	// only after 30 s (deploy/README.md, step 4): wait for the link.
	if err := waitUntil(30*time.Second, "leaf link us → eu", func() error {
		b, _ := os.ReadFile(s.natsSrv["us"].p.Log)
		if !bytes.Contains(b, []byte("Leafnode connection created")) {
			return errors.New("no leaf connection yet")
		}
		return nil
	}); err != nil {
		return err
	}

	for i, info := range Topology {
		port, err := freePort()
		if err != nil {
			return err
		}
		p := &popProc{info: info, addr: fmt.Sprintf("127.0.0.1:%d", port)}
		p.name, p.bin = info.Name, s.edge
		p.args = []string{"pop", "--listen", p.addr, "--data", filepath.Join(s.dir, "data-"+info.Name),
			"--rules", rules, "--log-level", "warn",
			"--region", info.Region, "--pop", info.Name, "--topology", topologyFlag,
			"--nats", fmt.Sprintf("nats://127.0.0.1:%d", s.natsSrv[info.Region].client),
			"--nats-nkey", filepath.Join(keys, info.Name+".nk"),
			"--flush-interval", flushInterval.String(), "--snapshot-interval", snapshotInterval.String(),
			"--breaker-cooldown", breakerCooldown.String()}
		if info.Redis {
			p.args = append(p.args, "--store", fmt.Sprintf("redis://127.0.0.1:%d/%d", s.redisAt, i%2))
		}
		s.pops = append(s.pops, p)
		if err := s.startPoP(p); err != nil {
			return err
		}
	}
	return nil
}

func (s *soak) startRedis() error {
	if err := s.redis.start(s.dir); err != nil {
		return err
	}
	return waitUntil(20*time.Second, "redis", func() error { return tcpUp(s.redisAt) })
}

func (s *soak) startNATS(n *natsProc) error {
	if err := n.start(s.dir); err != nil {
		return err
	}
	return waitUntil(20*time.Second, n.name, func() error {
		if n.p.Exited() {
			return fmt.Errorf("exited: %s", n.p.Tail(2000))
		}
		return tcpUp(n.client)
	})
}

func (s *soak) startPoP(p *popProc) error {
	if err := p.start(s.dir); err != nil {
		return err
	}
	return waitUntil(30*time.Second, p.name+" ready", func() error {
		if p.p.Exited() {
			return fmt.Errorf("exited: %s", p.p.Tail(2000))
		}
		return httpReady(p.addr)
	})
}

func (s *soak) stopAll() {
	for _, p := range s.pops {
		if p.p != nil && !p.p.Exited() {
			p.p.Terminate()
		}
	}
	for _, n := range s.natsSrv {
		if n.p != nil && !n.p.Exited() {
			n.p.Terminate()
		}
	}
	if s.redis != nil && s.redis.p != nil && !s.redis.p.Exited() {
		s.redis.p.Kill()
	}
}

// scrape saves every PoP's /metrics as metrics-<pop>-<when>.txt, for a
// post-mortem of the ledger (replication lag, reconciled hits, fallback).
func (s *soak) scrape(when string) {
	c := http.Client{Timeout: 5 * time.Second}
	for _, p := range s.pops {
		resp, err := c.Get("http://" + p.addr + "/metrics")
		if err != nil {
			s.logf("scrape %s: %v", p.name, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_ = os.WriteFile(filepath.Join(s.dir, fmt.Sprintf("metrics-%s-%s.txt", p.name, when)), b, 0o644)
	}
}

func redisCmd(port int, args ...string) error {
	out, err := exec.Command("redis-cli", append([]string{"-p", fmt.Sprint(port)}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli %v: %v: %s", args, err, out)
	}
	return nil
}

// fault makes the i-th fault of the schedule: kill -9 of a PoP (each in
// turn), Redis SHUTDOWN NOSAVE (restarted empty), a NATS server restart
// (each region in turn), Redis kill -9 (restarted from its last snapshot).
func (s *soak) fault(i int) (Fault, error) {
	kinds := s.cfg.Faults
	kind := kinds[i%len(kinds)]
	nth := s.count[kind] // earlier faults of this kind
	s.count[kind]++
	f := Fault{Kind: kind}
	s.scrape(fmt.Sprintf("before-fault%02d", i))
	var err error
	switch kind {
	case "pop-kill9":
		p := s.pops[nth%len(s.pops)]
		f.Target = p.name
		f.Down = time.Now().UnixNano()
		p.p.Kill()
		err = s.startPoP(p)
	case "redis-shutdown-nosave", "redis-kill9":
		f.Target = "redis"
		f.Down = time.Now().UnixNano()
		if kind == "redis-kill9" {
			s.redis.p.Kill()
		} else {
			if err := redisCmd(s.redisAt, "SHUTDOWN", "NOSAVE"); err != nil {
				s.logf("%v", err) // redis-cli reports the lost connection
			}
			waitUntil(10*time.Second, "redis exit", func() error {
				if !s.redis.p.Exited() {
					return errors.New("running")
				}
				return nil
			})
			_ = os.Remove(filepath.Join(s.redisDir, "dump.rdb"))
		}
		time.Sleep(time.Second)
		err = s.startRedis()
	case "nats-restart":
		region := []string{"eu", "us"}[nth%2]
		n := s.natsSrv[region]
		f.Target = region
		f.Down = time.Now().UnixNano()
		n.p.Terminate()
		time.Sleep(time.Second)
		err = s.startNATS(n)
	}
	f.Up = time.Now().UnixNano()
	return f, err
}

// Run runs the soak and returns its ledger; the ledger's Violations say
// whether a bound was broken.
func Run(ctx context.Context, cfg Config) (*Ledger, error) {
	cfg.defaults()
	for _, k := range cfg.Faults {
		if !slices.Contains(FaultKinds, k) {
			return nil, fmt.Errorf("unknown fault %q (known: %s)", k, strings.Join(FaultKinds, ", "))
		}
	}
	s := &soak{cfg: cfg, dir: cfg.Dir, classes: Classes(cfg.Limit), count: map[string]int{}}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	defer s.stopAll()
	if err := s.setup(ctx); err != nil {
		return nil, err
	}
	s.logf("4 PoPs ready; load for %v, a fault every %v", cfg.Duration, cfg.FaultEvery)

	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	if len(cfg.Faults) == 0 {
		cfg.FaultEvery = cfg.Duration + time.Hour // none
	}
	var (
		faults   []Fault
		faultErr error
		wg       sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(cfg.FaultEvery)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			f, err := s.fault(i)
			faults = append(faults, f)
			s.logf("fault %s %s: down %.2fs", f.Kind, f.Target, float64(f.Up-f.Down)/1e9)
			if err != nil {
				faultErr = fmt.Errorf("fault %s %s: %w", f.Kind, f.Target, err)
				cancel()
				return
			}
		}
	}()
	decisions, errs := s.load(ctx)
	wg.Wait()
	s.scrape("end")
	if faultErr != nil {
		return nil, faultErr
	}
	if err := writeCSV(filepath.Join(s.dir, "decisions.csv"), s.classes, decisions, faults); err != nil {
		return nil, err
	}
	info, _ := json.Marshal(runInfo{Limit: cfg.Limit, Window: cfg.Window, TransportErrors: errs})
	if err := os.WriteFile(filepath.Join(s.dir, "run.json"), info, 0o644); err != nil {
		return nil, err
	}
	return Check(s.classes, Topology, decisions, faults, bounds(cfg.Window), errs), nil
}

// stream is one key's offered traffic.
type stream struct {
	class, key int
	pops       []int   // PoPs it is sent to, at random
	rate       float64 // per second
}

// streams lays out the mixed load: per class HotKeys at Overload × the
// limit and TailKeys at 0.05–0.5 × it. Pop-scope keys go to one PoP each,
// region-scope keys to the PoPs of one region, global keys to every PoP.
func (s *soak) streams() []stream {
	rng := rand.New(rand.NewPCG(s.cfg.Seed, 7))
	perSec := float64(s.cfg.Limit) / s.cfg.Window.Seconds()
	var out []stream
	for ci, c := range s.classes {
		for k := 0; k < s.cfg.HotKeys+s.cfg.TailKeys; k++ {
			st := stream{class: ci, key: k}
			switch c.Scope {
			case "pop":
				st.pops = []int{k % len(Topology)}
			case "region":
				r := []string{"eu", "us"}[k%2]
				for i, p := range Topology {
					if p.Region == r {
						st.pops = append(st.pops, i)
					}
				}
			default:
				st.pops = []int{0, 1, 2, 3}
			}
			if k < s.cfg.HotKeys {
				st.rate = s.cfg.Overload * perSec
			} else {
				st.rate = (0.05 + 0.45*rng.Float64()) * perSec
			}
			out = append(out, st)
		}
	}
	return out
}

func (s *soak) load(ctx context.Context) ([]Decision, int) {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	streams := s.streams()
	var (
		mu   sync.Mutex
		all  []Decision
		errs int
		wg   sync.WaitGroup
	)
	for si, st := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(s.cfg.Seed, uint64(si)+100))
			var mine []Decision
			myErrs := 0
			body := fmt.Appendf(nil, `{"domain":"soak","descriptors":[{"entries":[{"key":%q,"value":"k%d"}]}]}`,
				s.classes[st.class].Name, st.key)
			next := time.Now()
			for {
				next = next.Add(time.Duration(rng.ExpFloat64() / st.rate * float64(time.Second)))
				if d := time.Until(next); d > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(d):
					}
				}
				if ctx.Err() != nil {
					break
				}
				pi := st.pops[rng.IntN(len(st.pops))]
				addr := s.pops[pi].addr
				send := time.Now().UnixNano()
				resp, err := client.Post("http://"+addr+"/v1/check", "application/json", bytes.NewReader(body))
				if err != nil {
					myErrs++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				recv := time.Now().UnixNano()
				if resp.StatusCode != 200 && resp.StatusCode != 429 {
					myErrs++
					continue
				}
				mine = append(mine, Decision{Send: send, Recv: recv, PoP: pi, Class: st.class, Key: st.key, Allowed: resp.StatusCode == 200})
			}
			mu.Lock()
			all = append(all, mine...)
			errs += myErrs
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all, errs
}

func writeCSV(path string, classes []Class, ds []Decision, faults []Fault) error {
	var b bytes.Buffer
	b.WriteString("send_ns,recv_ns,pop,class,key,allowed\n")
	for _, d := range ds {
		fmt.Fprintf(&b, "%d,%d,%s,%s,k%d,%t\n", d.Send, d.Recv, Topology[d.PoP].Name, classes[d.Class].Name, d.Key, d.Allowed)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return err
	}
	b.Reset()
	b.WriteString("kind,target,down_ns,up_ns\n")
	for _, f := range faults {
		fmt.Fprintf(&b, "%s,%s,%d,%d\n", f.Kind, f.Target, f.Down, f.Up)
	}
	return os.WriteFile(filepath.Join(filepath.Dir(path), "faults.csv"), b.Bytes(), 0o644)
}

// runInfo is what a run writes next to its decisions (run.json), for
// Recheck.
type runInfo struct {
	Limit           int
	Window          time.Duration
	TransportErrors int
}

// Recheck computes the ledger again from what a run wrote into dir
// (decisions.csv, faults.csv, run.json). Without run.json (an older run),
// limit and window are taken from cfg.
func Recheck(dir string, cfg Config) (*Ledger, error) {
	cfg.defaults()
	info := runInfo{Limit: cfg.Limit, Window: cfg.Window}
	if b, err := os.ReadFile(filepath.Join(dir, "run.json")); err == nil {
		if err := json.Unmarshal(b, &info); err != nil {
			return nil, err
		}
	}
	classes := Classes(info.Limit)
	classIdx := map[string]int{}
	for i, c := range classes {
		classIdx[c.Name] = i
	}
	popIdx := map[string]int{}
	for i, p := range Topology {
		popIdx[p.Name] = i
	}
	rows := func(name string, cols int) ([][]string, error) {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r := csv.NewReader(f)
		r.FieldsPerRecord = cols
		recs, err := r.ReadAll()
		if err != nil || len(recs) == 0 {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		return recs[1:], nil
	}
	drows, err := rows("decisions.csv", 6)
	if err != nil {
		return nil, err
	}
	ds := make([]Decision, 0, len(drows))
	for _, r := range drows {
		var d Decision
		var ok1, ok2 bool
		d.PoP, ok1 = popIdx[r[2]]
		d.Class, ok2 = classIdx[r[3]]
		_, e1 := fmt.Sscan(r[0], &d.Send)
		_, e2 := fmt.Sscan(r[1], &d.Recv)
		_, e3 := fmt.Sscanf(r[4], "k%d", &d.Key)
		if !ok1 || !ok2 || e1 != nil || e2 != nil || e3 != nil {
			return nil, fmt.Errorf("decisions.csv: bad row %v", r)
		}
		d.Allowed = r[5] == "true"
		ds = append(ds, d)
	}
	frows, err := rows("faults.csv", 4)
	if err != nil {
		return nil, err
	}
	var faults []Fault
	for _, r := range frows {
		f := Fault{Kind: r[0], Target: r[1]}
		if _, err := fmt.Sscan(r[2], &f.Down); err != nil {
			return nil, err
		}
		if _, err := fmt.Sscan(r[3], &f.Up); err != nil {
			return nil, err
		}
		faults = append(faults, f)
	}
	return Check(classes, Topology, ds, faults, bounds(info.Window), info.TransportErrors), nil
}

func bounds(window time.Duration) Bounds {
	return Bounds{
		Window:        window,
		FlushInterval: flushInterval,
		Staleness:     2 * flushInterval,
		NATSRecovery:  natsReconnect + snapshotInterval,
	}
}

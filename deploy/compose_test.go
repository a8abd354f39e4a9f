package deploy

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/deploy/lab"
	"github.com/edgelimit/edgelimit/region"
	"github.com/edgelimit/edgelimit/replication"
)

// composeService is what the test reads of a compose service.
type composeService struct {
	Image       string            `yaml:"image"`
	Build       map[string]string `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   []string          `yaml:"depends_on"`
}

// composeInterp matches compose's ${VAR...} interpolation.
var composeInterp = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}`)

// resolve replaces compose interpolations with a stand-in secret.
func resolve(v string) string {
	return composeInterp.ReplaceAllString(v, "Secret1$1")
}

// hostPort splits u (a URL or host:port) and returns its host and port.
func hostPort(t *testing.T, u string) (string, string) {
	t.Helper()
	if strings.Contains(u, "://") {
		p, err := url.Parse(u)
		if err != nil {
			t.Fatalf("URL %q: %v", u, err)
		}
		u = p.Host
	}
	h, p, err := net.SplitHostPort(u)
	if err != nil {
		t.Fatalf("%q: %v", u, err)
	}
	return h, p
}

// TestComposeFile checks deploy/compose.yaml without a container runtime,
// against one source of truth for each thing it uses: the PoPs' flags and
// EDGELIMIT_* variables against `edgelimit pop --help`, their data volume
// against the Dockerfile's; every variable a NATS config uses is set, every
// host named is a service of the right region on the port its config
// listens on; the NATS image is recent enough
// (replication.MinServerVersion); the topology names exactly the PoPs;
// every mounted file exists; Prometheus scrapes exactly the PoPs, as job
// edgelimit, and promtool accepts its config.
func TestComposeFile(t *testing.T) {
	flags := popFlags(t)
	keys := natsKeys(t, composeTopology(t))
	var file struct {
		Services map[string]composeService `yaml:"services"`
		Volumes  map[string]any            `yaml:"volumes"`
	}
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "deploy/compose.yaml")), &file); err != nil {
		t.Fatal(err)
	}
	svcs := file.Services
	regionOf := func(name string) string { return svcs[name].Environment["EDGELIMIT_REGION"] }
	mounts := func(name string, s composeService) map[string]string { // target -> source
		out := map[string]string{}
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) < 2 {
				t.Errorf("%s: volume %q has no target", name, v)
				continue
			}
			src, dst := parts[0], parts[1]
			if gen, ok := strings.CutPrefix(src, "./nats/keys/"); ok {
				// Written by edgelimit natsconf before compose up.
				if _, err := os.Stat(filepath.Join(keys, gen)); err != nil {
					t.Errorf("%s mounts %s, which edgelimit natsconf does not write: %v", name, src, err)
				}
			} else if strings.HasPrefix(src, ".") {
				if _, err := os.Stat(src); err != nil {
					t.Errorf("%s mounts %s: %v", name, src, err)
				}
			} else if _, ok := file.Volumes[src]; !ok {
				t.Errorf("%s mounts volume %s, which compose.yaml does not declare", name, src)
			}
			out[dst] = src
		}
		return out
	}
	dockerData := regexp.MustCompile(`EDGELIMIT_DATA=(\S+)`).FindStringSubmatch(readRepoFile(t, "deploy/Dockerfile"))[1]

	var pops, natsServers []string
	hostPorts := map[string]bool{}
	for name, s := range svcs {
		m := mounts(name, s)
		for _, p := range s.Ports {
			host, _, _ := strings.Cut(p, ":")
			if hostPorts[host] {
				t.Errorf("%s publishes host port %s, which another service publishes", name, host)
			}
			hostPorts[host] = true
		}
		for _, d := range s.DependsOn {
			if _, ok := svcs[d]; !ok {
				t.Errorf("%s depends on %s, which is no service", name, d)
			}
		}
		switch {
		case s.Build != nil: // an edgelimit PoP
			pops = append(pops, name)
			if df := filepath.Join(s.Build["context"], s.Build["dockerfile"]); df != "../deploy/Dockerfile" {
				t.Errorf("%s builds %s, not deploy/Dockerfile", name, df)
			}
			for k := range s.Environment {
				if f := envFlag(k); f == "" || !slices.Contains(flags, f) {
					t.Errorf("%s: environment %s sets no flag of edgelimit pop", name, k)
				}
			}
			if len(s.Command) == 0 || s.Command[0] != "pop" {
				t.Errorf("%s: command %v does not run a PoP", name, s.Command)
			}
			for _, f := range flagsOf(s.Command) {
				if !slices.Contains(flags, f) {
					t.Errorf("%s: command passes --%s, which edgelimit pop does not have", name, f)
				}
			}
			if i := slices.Index(s.Command, "--rules"); i >= 0 {
				found := false
				for dst := range m {
					found = found || strings.HasPrefix(dst, s.Command[i+1])
				}
				if !found {
					t.Errorf("%s: --rules %s is not mounted", name, s.Command[i+1])
				}
			}
			if _, ok := m[dockerData]; !ok {
				t.Errorf("%s: no volume on the image's data directory %s", name, dockerData)
			}
		case strings.HasPrefix(s.Image, "nats:"):
			natsServers = append(natsServers, name)
			tag := strings.TrimPrefix(s.Image, "nats:")
			v, _, _ := strings.Cut(tag, "-")
			if strings.Count(v, ".") == 1 {
				v += ".0"
			}
			if err := replication.CheckServerVersion(v); err != nil {
				t.Errorf("%s: image %s: %v", name, s.Image, err)
			}
			conf, ok := m["/etc/nats/nats.conf"]
			if !ok || !slices.Contains(s.Command, "/etc/nats/nats.conf") {
				t.Errorf("%s: does not run the mounted /etc/nats/nats.conf (command %v)", name, s.Command)
				continue
			}
			text, err := os.ReadFile(conf)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range lab.ConfVars(string(text)) {
				if _, ok := s.Environment[v]; !ok {
					t.Errorf("%s: %s uses $%s, which the service's environment does not set", name, conf, v)
				}
			}
			// What the config includes (the accounts; a leaf region's
			// leaf-remote.conf) is mounted beside it.
			for _, inc := range regexp.MustCompile(`(?m)^\s*include\s+(\S+)`).FindAllSubmatch(text, -1) {
				if _, ok := m["/etc/nats/"+string(inc[1])]; !ok {
					t.Errorf("%s: %s includes %s, which no volume mounts at /etc/nats/%s", name, conf, inc[1], inc[1])
				}
			}
			if dir := regexp.MustCompile(`store_dir: (\S+)`).FindSubmatch(text); dir == nil || !slices.ContainsFunc(slices.Collect(maps.Keys(m)), func(dst string) bool {
				return strings.HasPrefix(string(dir[1]), dst+"/")
			}) {
				t.Errorf("%s: no volume holds the JetStream store_dir of %s", name, conf)
			}
		}
	}
	if len(pops) != 6 || len(natsServers) != 9 {
		t.Errorf("%d PoPs and %d NATS servers, want 3 regions × 2 PoPs and 3 NATS servers per region", len(pops), len(natsServers))
	}

	// Hosts and ports each service names.
	want := func(from, what, u, port string, ok func(host string) bool) {
		h, p := hostPort(t, resolve(u))
		if _, exists := svcs[h]; !exists || !ok(h) || p != port {
			t.Errorf("%s: %s %s is not a suitable service on port %s", from, what, u, port)
		}
	}
	topo := map[string][]string{}
	for _, name := range pops {
		env := svcs[name].Environment
		r, pop := env["EDGELIMIT_REGION"], env["EDGELIMIT_POP"]
		if name != "pop-"+pop {
			t.Errorf("service %s runs PoP %q", name, pop)
		}
		tp, err := region.Parse(env["EDGELIMIT_TOPOLOGY"])
		if err != nil {
			t.Fatalf("%s: topology: %v", name, err)
		}
		if tp.RegionOf(pop) != r {
			t.Errorf("%s: topology puts %s in region %q, not %q", name, pop, tp.RegionOf(pop), r)
		}
		topo[r] = append(topo[r], pop)
		for _, u := range strings.Split(env["EDGELIMIT_NATS"], ",") {
			want(name, "NATS URL", u, "4222", func(h string) bool { return slices.Contains(natsServers, h) && regionOf(h) == r })
		}
		want(name, "store", env["EDGELIMIT_STORE"], "6379", func(h string) bool { return strings.HasPrefix(svcs[h].Image, "redis:") })
		if t.Failed() {
			continue
		}
		for pr, ps := range tp.Regions {
			for _, p := range ps {
				if _, ok := svcs["pop-"+p]; !ok || regionOf("pop-"+p) != pr {
					t.Errorf("%s: topology names PoP %s in %s, which no service runs", name, p, pr)
				}
			}
		}
	}
	for _, name := range natsServers {
		env := svcs[name].Environment
		r := env["EDGELIMIT_REGION"]
		if env["NATS_SERVER_NAME"] != name {
			t.Errorf("service %s runs NATS server %q", name, env["NATS_SERVER_NAME"])
		}
		for i := 1; i <= 3; i++ {
			want(name, "route", env[fmt.Sprintf("NATS_ROUTE_%d", i)], "6222", func(h string) bool { return regionOf(h) == r })
		}
		for _, k := range []string{"EDGELIMIT_HUB_URL", "EDGELIMIT_HUB_URL_2", "EDGELIMIT_HUB_URL_3"} {
			if u, ok := env[k]; ok {
				want(name, k, u, "7422", func(h string) bool { _, hub := svcs[h].Environment["EDGELIMIT_LEAF_NKEY"]; return hub })
			}
		}
	}
	if len(topo) != 3 {
		t.Errorf("PoPs in %d regions, want 3", len(topo))
	}

	// Prometheus scrapes exactly the PoPs as job edgelimit.
	prom := svcs["prometheus"]
	m := mounts("prometheus", prom)
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	promFile := m["/etc/prometheus/prometheus.yml"]
	b, err := os.ReadFile(promFile)
	if err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, rf := range cfg.RuleFiles {
		if _, ok := m[filepath.Join("/etc/prometheus", rf)]; !ok {
			t.Errorf("prometheus.yml loads %s, which is not mounted", rf)
		}
	}
	var targets []string
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName != "edgelimit" {
			continue
		}
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	var wantTargets []string
	for _, p := range pops {
		wantTargets = append(wantTargets, p+":8080")
	}
	slices.Sort(targets)
	slices.Sort(wantTargets)
	if !slices.Equal(targets, wantTargets) {
		t.Errorf("job edgelimit scrapes %v, want the PoPs %v", targets, wantTargets)
	}
	if promtool, err := exec.LookPath("promtool"); err == nil {
		if out, err := exec.Command(promtool, "check", "config", promFile).CombinedOutput(); err != nil {
			t.Errorf("promtool check config %s: %v\n%s", promFile, err, out)
		}
	} else {
		t.Log("promtool not found: prometheus.yml not checked by promtool (TestAlertsPromtool says more)")
	}
}

// composeTopology returns the --topology the compose file's PoPs share.
func composeTopology(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`EDGELIMIT_TOPOLOGY: "([^"]+)"`).FindStringSubmatch(readRepoFile(t, "deploy/compose.yaml"))
	if m == nil {
		t.Fatal("compose.yaml sets no EDGELIMIT_TOPOLOGY")
	}
	return m[1]
}

package deploy

import (
	"encoding/json"
	"fmt"
	"net"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// A Redis belongs to one PoP. The servers of one PoP may share it (they run
// the same --pop), but two PoPs on one Redis each publish what it holds as
// their own count, so every hit of a region or global limit counts twice (a
// global 100/h admits about 51). The tests here hold the shipped layouts to
// that: no Redis server is the store of two PoP names.

// redisServers returns the Redis servers (host:port) a --store value names:
// none for the embedded store, one for a URL, each seed of a Cluster list
// (`host:port,host:port,…`). A database of its own (`/1`) on a shared server
// does not make a Redis of its own here: the shipped files give each PoP a
// server, and a Cluster has no databases.
func redisServers(store string) []string {
	store = strings.TrimSpace(store)
	if store == "" || store == "embedded" {
		return nil
	}
	var out []string
	for _, s := range strings.Split(store, ",") {
		s = strings.TrimSpace(s)
		if _, rest, ok := strings.Cut(s, "://"); ok {
			s = rest
		}
		if i := strings.LastIndexByte(s, '@'); i >= 0 {
			s = s[i+1:]
		}
		if i := strings.IndexAny(s, "/?"); i >= 0 {
			s = s[:i]
		}
		if s == "" {
			continue
		}
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			host, port = s, "6379"
		}
		out = append(out, net.JoinHostPort(strings.ToLower(host), port))
	}
	return out
}

// sharedRedis says, for stores (PoP name → the --store of each of its
// servers), which Redis servers more than one PoP uses.
func sharedRedis(stores map[string][]string) []string {
	users := map[string][]string{} // Redis server → PoP names
	for pop, ss := range stores {
		for _, s := range ss {
			for _, srv := range redisServers(s) {
				if !slices.Contains(users[srv], pop) {
					users[srv] = append(users[srv], pop)
				}
			}
		}
	}
	var out []string
	for srv, pops := range users {
		if len(pops) > 1 {
			slices.Sort(pops)
			out = append(out, fmt.Sprintf("Redis %s is the store of PoPs %s: every region and global hit would count once per PoP; give each PoP its own",
				srv, strings.Join(pops, ", ")))
		}
	}
	slices.Sort(out)
	return out
}

// composeStores reads a compose file's PoP services: PoP name → stores.
func composeStores(text string) (map[string][]string, error) {
	var file struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal([]byte(text), &file); err != nil {
		return nil, err
	}
	stores := map[string][]string{}
	for name, s := range file.Services {
		if s.Build == nil { // not an edgelimit PoP
			continue
		}
		pop, store := s.Environment["EDGELIMIT_POP"], s.Environment["EDGELIMIT_STORE"]
		for i, a := range s.Command {
			if i+1 < len(s.Command) && a == "--pop" {
				pop = s.Command[i+1]
			} else if i+1 < len(s.Command) && a == "--store" {
				store = s.Command[i+1]
			}
		}
		if pop == "" {
			return nil, fmt.Errorf("service %s names no PoP", name)
		}
		stores[pop] = append(stores[pop], resolve(store))
	}
	return stores, nil
}

// TestComposeRedisPerPoP: no Redis of deploy/compose.yaml is the store of
// two PoPs; and the check catches the layout it replaced, one Redis per
// region shared by the region's PoPs.
func TestComposeRedisPerPoP(t *testing.T) {
	text := readRepoFile(t, "deploy/compose.yaml")
	stores, err := composeStores(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(stores) != 6 {
		t.Errorf("%d PoPs in compose.yaml, want 6", len(stores))
	}
	for _, p := range sharedRedis(stores) {
		t.Errorf("compose.yaml: %s", p)
	}
	for pop, ss := range stores {
		if len(redisServers(ss[0])) == 0 {
			t.Errorf("compose.yaml: PoP %s has no Redis: the file shows a Redis per PoP", pop)
		}
	}

	// The check itself, on the layout compose.yaml had: one Redis per
	// region, set where the region's PoPs share their settings.
	badStores, err := composeStores(regionRedisCompose)
	if err != nil {
		t.Fatal(err)
	}
	if got := sharedRedis(badStores); len(got) != 1 || !strings.Contains(got[0], "redis-eu:6379 is the store of PoPs eu-1, eu-2") {
		t.Errorf("eu-1 and eu-2 on one Redis (%v): the check says %q", badStores, got)
	}
}

// regionRedisCompose is the part of compose.yaml that shared a Redis
// between the PoPs of a region, before each PoP had one.
const regionRedisCompose = `
x-pop: &pop
  build: {context: .., dockerfile: deploy/Dockerfile}
  command: ["pop", "--rules", "/etc/edgelimit/rules.d"]
x-pop-eu: &pop-eu
  EDGELIMIT_REGION: eu
  EDGELIMIT_STORE: redis://redis-eu:6379
services:
  redis-eu:
    image: redis:7-alpine
  pop-eu-1:
    <<: *pop
    environment: {<<: *pop-eu, EDGELIMIT_POP: eu-1}
  pop-eu-2:
    <<: *pop
    environment: {<<: *pop-eu, EDGELIMIT_POP: eu-2}
`

// k8sPoPStores returns, for the rendered objects, each PoP pod's PoP name
// and store as Kubernetes and the PoP would see them: the command line
// over the environment over the --config file (a ConfigMap), $(VAR) in env
// values and args expanded from the variables defined before them, a
// pod's own name (fieldRef metadata.name) and index as the pod has them.
// A value taken from elsewhere (a Secret) is the same for every pod.
func k8sPoPStores(objs []k8sObject) (map[string][]string, error) {
	configMaps := map[string]map[string]string{}
	for _, o := range objs {
		if o.Kind == "ConfigMap" {
			configMaps[o.Metadata.Name] = o.Data
		}
	}
	varRef := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	stores := map[string][]string{}
	for _, o := range objs {
		if o.Kind != "StatefulSet" {
			continue
		}
		for _, c := range o.Spec.Template.Spec.Containers {
			if c.Name != "edgelimit" {
				continue
			}
			var file map[string]any
			if i := slices.Index(c.Args, "--config"); i >= 0 && i+1 < len(c.Args) {
				dir, base := path.Split(c.Args[i+1])
				text := ""
				for _, m := range c.VolumeMounts {
					if m.MountPath+"/" != dir {
						continue
					}
					for _, v := range o.Spec.Template.Spec.Volumes {
						if v.Name == m.Name && v.ConfigMap != nil {
							text = configMaps[v.ConfigMap.Name][base]
						}
					}
				}
				if text == "" {
					return nil, fmt.Errorf("%s: --config %s is no file of a mounted ConfigMap", o.Metadata.Name, c.Args[i+1])
				}
				if err := yaml.Unmarshal([]byte(text), &file); err != nil {
					return nil, fmt.Errorf("%s: --config %s: %v", o.Metadata.Name, c.Args[i+1], err)
				}
			}
			for i := range o.Spec.Replicas {
				podName := fmt.Sprintf("%s-%d", o.Metadata.Name, i)
				env := map[string]string{}
				expand := func(v string) string {
					return varRef.ReplaceAllStringFunc(v, func(ref string) string {
						if val, ok := env[ref[2:len(ref)-1]]; ok {
							return val
						}
						return ref // undefined (or defined later): Kubernetes leaves it as is
					})
				}
				for _, e := range c.Env {
					switch {
					case e.ValueFrom == nil:
						env[e.Name] = expand(e.Value)
					default:
						ref, _ := e.ValueFrom["fieldRef"].(map[string]any)
						switch fp, _ := ref["fieldPath"].(string); fp {
						case "metadata.name":
							env[e.Name] = podName
						case "metadata.labels['apps.kubernetes.io/pod-index']":
							env[e.Name] = strconv.Itoa(i)
						default:
							b, _ := json.Marshal(e.ValueFrom)
							env[e.Name] = string(b)
						}
					}
				}
				setting := func(flag string) string {
					if j := slices.Index(c.Args, "--"+flag); j >= 0 && j+1 < len(c.Args) {
						return expand(c.Args[j+1])
					}
					if v, ok := env["EDGELIMIT_"+strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))]; ok {
						return v
					}
					if v, ok := file[flag]; ok {
						return fmt.Sprint(v)
					}
					return ""
				}
				pop := setting("pop")
				if pop == "" {
					return nil, fmt.Errorf("%s: pod %s names no PoP", o.Metadata.Name, podName)
				}
				stores[pop] = append(stores[pop], setting("store"))
			}
		}
	}
	return stores, nil
}

// TestK8sRedisPerPoP: in the rendered deploy/k8s, where each pod is a PoP
// of its own (EDGELIMIT_POP is the pod's name), no Redis is the store of
// two PoPs; and the check catches a region's StatefulSet given one Redis
// URL, which every pod of it — every PoP of the region — would share.
func TestK8sRedisPerPoP(t *testing.T) {
	objs := renderK8s(t)
	stores, err := k8sPoPStores(objs)
	if err != nil {
		t.Fatal(err)
	}
	if len(stores) != 6 {
		t.Errorf("%d PoPs rendered (%v), want 6", len(stores), stores)
	}
	t.Logf("PoP → store: %v", stores)
	for _, p := range sharedRedis(stores) {
		t.Errorf("deploy/k8s: %s", p)
	}

	// The check itself: one Redis URL for region eu's StatefulSet.
	for i, o := range objs {
		if o.Kind != "StatefulSet" || o.Metadata.Name != "edgelimit-eu" {
			continue
		}
		c := &objs[i].Spec.Template.Spec.Containers[0]
		c.Env = slices.Clone(c.Env)
		for j := range c.Env {
			if c.Env[j].Name == "EDGELIMIT_STORE" {
				c.Env[j].Value = "redis://redis-eu:6379"
			}
		}
	}
	bad, err := k8sPoPStores(objs)
	if err != nil {
		t.Fatal(err)
	}
	if len(sharedRedis(bad)) == 0 {
		t.Errorf("edgelimit-eu-0 and edgelimit-eu-1 on one Redis (%v) not caught", bad)
	}
}

// TestRedisServers: the --store forms the check reads.
func TestRedisServers(t *testing.T) {
	for store, want := range map[string][]string{
		"":                               nil,
		"embedded":                       nil,
		"redis://redis-eu-1:6379":        {"redis-eu-1:6379"},
		"redis://:Secret1X@Redis-EU-1":   {"redis-eu-1:6379"},
		"rediss://u:p@10.0.0.1:6380/2":   {"10.0.0.1:6380"},
		"redis-a:7000,redis-b:7001":      {"redis-a:7000", "redis-b:7001"},
		"redis://[::1]:6379/0?protocol=": {"[::1]:6379"},
	} {
		if got := redisServers(store); !slices.Equal(got, want) {
			t.Errorf("redisServers(%q) = %q, want %q", store, got, want)
		}
	}
}

package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/deploy/lab"
	"github.com/edgelimit/edgelimit/region"
)

// k8sCopies are the files deploy/k8s/files holds copies of, because
// kustomize reads no file outside its directory.
var k8sCopies = map[string]string{
	"deploy/k8s/files/hub-region.conf":  "deploy/nats/hub-region.conf",
	"deploy/k8s/files/leaf-region.conf": "deploy/nats/leaf-region.conf",
	"deploy/k8s/files/pop.yaml":         "deploy/systemd/pop.yaml",
	"deploy/k8s/files/rules.yaml":       "deploy/examples/rules.yaml",
}

// Kubernetes objects as far as the test reads them.
type k8sObject struct {
	Kind     string
	Metadata struct{ Name string }
	Data     map[string]string
	Spec     struct {
		ServiceName string `yaml:"serviceName"`
		Replicas    int
		Selector    struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		}
		Ports []struct {
			Name string
			Port int
		}
		Template struct {
			Spec struct {
				Containers []k8sContainer
				Volumes    []struct {
					Name      string
					ConfigMap *struct{ Name string } `yaml:"configMap"`
					Projected *struct {
						Sources []struct {
							ConfigMap *struct{ Name string } `yaml:"configMap"`
							Secret    *struct{ Name string } `yaml:"secret"`
						}
					}
				}
			}
		}
		VolumeClaimTemplates []struct{ Metadata struct{ Name string } } `yaml:"volumeClaimTemplates"`
	}
}

type k8sContainer struct {
	Name  string
	Args  []string
	Ports []struct {
		Name          string
		ContainerPort int `yaml:"containerPort"`
	}
	Env []struct {
		Name      string
		Value     string
		ValueFrom map[string]any `yaml:"valueFrom"`
	}
	VolumeMounts []struct {
		Name      string
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path string
		Port any
	} `yaml:"httpGet"`
}

// renderK8s runs `kubectl kustomize deploy/k8s` and decodes its objects.
// Without kubectl it runs `kustomize build deploy/k8s`, the same kustomize
// as a command of its own: what .ci/run installs (with go install) on a
// machine without kubectl, since Debian's kubectl is too old to read the
// kustomization. With neither, it skips, or fails under CI=true.
func renderK8s(t *testing.T) []k8sObject {
	t.Helper()
	render := []string{"kubectl", "kustomize", "k8s"}
	if _, err := exec.LookPath("kubectl"); err != nil {
		_, kerr := exec.LookPath("kustomize")
		if kerr != nil {
			msg := fmt.Sprintf("neither kubectl (%v) nor kustomize (%v) is on PATH: cannot render deploy/k8s, %s DID NOT RUN "+
				"(go install sigs.k8s.io/kustomize/kustomize/v5@v5.8.1, as .ci/run does)", err, kerr, t.Name())
			if os.Getenv("CI") == "true" {
				t.Fatal(msg + " — failing because CI=true")
			}
			t.Skip("SKIPPED: " + msg)
		}
		render = []string{"kustomize", "build", "k8s"}
	}
	// The operator's first step (kustomization.yaml): the PoPs' nkeys.
	keys := filepath.Join("k8s", "keys")
	t.Cleanup(func() { os.RemoveAll(keys) })
	if out, err := exec.Command(edgelimitBin(t), "natsconf", "--keys", keys, "--topology",
		"eu=edgelimit-eu-0,edgelimit-eu-1;us=edgelimit-us-0,edgelimit-us-1;ap=edgelimit-ap-0,edgelimit-ap-1").CombinedOutput(); err != nil {
		t.Fatalf("edgelimit natsconf: %v\n%s", err, out)
	}
	cmd := exec.Command(render[0], render[1:]...)
	cmd.Stderr = new(bytes.Buffer)
	out, err := cmd.Output() // stdout alone: kustomize warns on stderr
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(render, " "), err, cmd.Stderr)
	}
	var objs []k8sObject
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o k8sObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding the rendered manifests: %v", err)
		}
		objs = append(objs, o)
	}
	return objs
}

// TestK8sManifests renders deploy/k8s and checks it against the binary and
// the files it deploys: every flag and EDGELIMIT_* variable of the PoPs is
// one of `edgelimit pop --help`; the ConfigMaps hold the very files the lab
// and the systemd unit use; every file path a container names is mounted
// from the ConfigMap or volume that holds it; ports are the ones the files
// listen on; probes ask /healthz and /readyz; each region's --topology
// names its StatefulSet's pods; every NATS config variable is set; routes and
// hub URLs name servers that exist.
func TestK8sManifests(t *testing.T) {
	for copy, src := range k8sCopies {
		if readRepoFile(t, copy) != readRepoFile(t, src) {
			t.Errorf("%s differs from %s: cp %s %s", copy, src, src, copy)
		}
	}
	flags := popFlags(t)
	objs := renderK8s(t)
	configMaps := map[string]map[string]string{} // generated name prefix → data
	secrets := map[string]map[string]string{}    // the same, of Secrets
	sets := map[string]k8sObject{}
	services := map[string]k8sObject{}
	for _, o := range objs {
		switch o.Kind {
		case "ConfigMap":
			base := regexp.MustCompile(`-[a-z0-9]{10}$`).ReplaceAllString(o.Metadata.Name, "")
			configMaps[base] = o.Data
		case "Secret":
			secrets[regexp.MustCompile(`-[a-z0-9]{10}$`).ReplaceAllString(o.Metadata.Name, "")] = o.Data
		case "StatefulSet":
			sets[o.Metadata.Name] = o
		case "Service":
			services[o.Metadata.Name] = o
		}
	}
	for _, name := range []string{"nats-config", "edgelimit-pop", "edgelimit-rules"} {
		if configMaps[name] == nil {
			t.Fatalf("no ConfigMap %s rendered", name)
		}
	}
	for key, src := range map[string]string{"hub-region.conf": "deploy/nats/hub-region.conf", "leaf-region.conf": "deploy/nats/leaf-region.conf"} {
		if configMaps["nats-config"][key] != readRepoFile(t, src) {
			t.Errorf("ConfigMap nats-config[%s] is not %s", key, src)
		}
	}
	if configMaps["edgelimit-pop"]["pop.yaml"] != readRepoFile(t, "deploy/systemd/pop.yaml") {
		t.Error("ConfigMap edgelimit-pop[pop.yaml] is not deploy/systemd/pop.yaml")
	}

	// mounted finds the mount of path in c: the volume and the file's name
	// under it ("" for a directory).
	mounted := func(o k8sObject, c k8sContainer, p string) (configMap, claim, rest string) {
		for _, m := range c.VolumeMounts {
			if p != m.MountPath && !strings.HasPrefix(p, m.MountPath+"/") {
				continue
			}
			rest = strings.TrimPrefix(strings.TrimPrefix(p, m.MountPath), "/")
			for _, v := range o.Spec.Template.Spec.Volumes {
				if v.Name == m.Name && v.ConfigMap != nil {
					return v.ConfigMap.Name, "", rest
				}
			}
			for _, v := range o.Spec.VolumeClaimTemplates {
				if v.Metadata.Name == m.Name {
					return "", m.Name, rest
				}
			}
		}
		return "", "", ""
	}
	cmBase := func(n string) string { return regexp.MustCompile(`-[a-z0-9]{10}$`).ReplaceAllString(n, "") }
	// holds says whether a volume mounted in c holds the file p: the
	// deepest mount over it, a ConfigMap or a projection of ConfigMaps and
	// Secrets with that key.
	holds := func(o k8sObject, c k8sContainer, p string) bool {
		best, rest := "", ""
		for _, m := range c.VolumeMounts {
			if strings.HasPrefix(p, m.MountPath+"/") && len(m.MountPath) > len(best) {
				best, rest = m.Name, strings.TrimPrefix(p, m.MountPath+"/")
			}
		}
		for _, v := range o.Spec.Template.Spec.Volumes {
			switch {
			case v.Name != best:
			case v.ConfigMap != nil:
				return configMaps[cmBase(v.ConfigMap.Name)][rest] != ""
			case v.Projected != nil:
				for _, src := range v.Projected.Sources {
					if (src.ConfigMap != nil && configMaps[cmBase(src.ConfigMap.Name)][rest] != "") ||
						(src.Secret != nil && secrets[cmBase(src.Secret.Name)][rest] != "") {
						return true
					}
				}
			}
		}
		return false
	}
	// pod says whether host (pod.service) is a pod of a StatefulSet here.
	pod := func(host string) (k8sObject, bool) {
		name, svc, ok := strings.Cut(host, ".")
		if !ok {
			return k8sObject{}, false
		}
		s, ok := sets[svc]
		if !ok || s.Spec.ServiceName != svc {
			return k8sObject{}, false
		}
		i := strings.LastIndexByte(name, '-')
		n, err := strconv.Atoi(name[i+1:])
		return s, name[:i] == svc && err == nil && n >= 0 && n < s.Spec.Replicas
	}
	hasPort := func(c k8sContainer, port int) bool {
		return slices.ContainsFunc(c.Ports, func(p struct {
			Name          string
			ContainerPort int `yaml:"containerPort"`
		}) bool {
			return p.ContainerPort == port
		})
	}

	var pops, nats int
	for name, o := range sets {
		if len(o.Spec.VolumeClaimTemplates) == 0 {
			t.Errorf("%s: no volume claim: its state would not survive a restart", name)
		}
		if _, ok := services[o.Spec.ServiceName]; !ok {
			t.Errorf("%s: serviceName %q is no Service", name, o.Spec.ServiceName)
		}
		for _, c := range o.Spec.Template.Spec.Containers {
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			switch c.Name {
			case "edgelimit":
				pops++
				for _, f := range flagsOf(c.Args) {
					if !slices.Contains(flags, f) {
						t.Errorf("%s: --%s is not a flag of edgelimit pop", name, f)
					}
				}
				for k := range env {
					if f := envFlag(k); f == "" || !slices.Contains(flags, f) {
						t.Errorf("%s: %s sets no flag of edgelimit pop", name, k)
					}
				}
				arg := func(flag string) string {
					i := slices.Index(c.Args, "--"+flag)
					if i < 0 || i+1 >= len(c.Args) {
						t.Fatalf("%s: no --%s", name, flag)
					}
					return c.Args[i+1]
				}
				if cm, _, file := mounted(o, c, arg("config")); cmBase(cm) != "edgelimit-pop" || configMaps["edgelimit-pop"][file] == "" {
					t.Errorf("%s: --config %s is not a file of ConfigMap edgelimit-pop", name, arg("config"))
				}
				if cm, _, rest := mounted(o, c, arg("rules")); cmBase(cm) != "edgelimit-rules" || rest != "" {
					t.Errorf("%s: --rules %s is not the mount of ConfigMap edgelimit-rules", name, arg("rules"))
				}
				if _, claim, _ := mounted(o, c, env["EDGELIMIT_DATA"]); claim == "" {
					t.Errorf("%s: EDGELIMIT_DATA %q is not on a volume claim", name, env["EDGELIMIT_DATA"])
				}
				_, port, _ := strings.Cut(env["EDGELIMIT_LISTEN"], ":")
				if p, _ := strconv.Atoi(port); !hasPort(c, p) {
					t.Errorf("%s: listens on %q, which is no containerPort", name, env["EDGELIMIT_LISTEN"])
				}
				if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
					c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
					t.Errorf("%s: probes must be GET /healthz (liveness) and /readyz (readiness)", name)
				}
				r := env["EDGELIMIT_REGION"]
				tp, err := region.Parse(env["EDGELIMIT_TOPOLOGY"])
				if err != nil {
					t.Fatalf("%s: EDGELIMIT_TOPOLOGY: %v", name, err)
				}
				for i := range o.Spec.Replicas {
					if p := fmt.Sprintf("%s-%d", name, i); tp.RegionOf(p) != r {
						t.Errorf("%s: pod %s (its PoP name) is not in region %s of the topology", name, p, r)
					}
				}
				for _, u := range strings.Split(env["EDGELIMIT_NATS"], ",") {
					host, port := hostPort(t, u)
					if s, ok := pod(host); !ok || s.Spec.Template.Spec.Containers[0].Name != "nats" || port != "4222" ||
						!strings.HasSuffix(s.Metadata.Name, "-"+r) {
						t.Errorf("%s: --nats %s is no NATS server of region %s", name, u, r)
					}
				}
			case "nats":
				nats++
				if len(c.Args) != 2 || c.Args[0] != "-c" {
					t.Fatalf("%s: args %q, want -c FILE", name, c.Args)
				}
				cm, _, file := mounted(o, c, c.Args[1])
				conf := configMaps[cmBase(cm)][file]
				if conf == "" {
					t.Fatalf("%s: -c %s is not a file of a ConfigMap", name, c.Args[1])
				}
				var set []string
				for _, e := range c.Env {
					set = append(set, e.Name+"=x")
				}
				if err := lab.CheckEnv(file, conf, set); err != nil {
					t.Errorf("%s: %v", name, err)
				}
				// What the config includes (the accounts; a leaf region's
				// leaf-remote.conf) is mounted beside it.
				for _, inc := range regexp.MustCompile(`(?m)^\s*include\s+(\S+)`).FindAllStringSubmatch(conf, -1) {
					if !holds(o, c, path.Join(path.Dir(c.Args[1]), inc[1])) {
						t.Errorf("%s: %s includes %s, which no volume of the pod holds", name, file, inc[1])
					}
				}
				for _, m := range regexp.MustCompile(`listen: 0\.0\.0\.0:(\d+)`).FindAllStringSubmatch(conf, -1) {
					if p, _ := strconv.Atoi(m[1]); !hasPort(c, p) {
						t.Errorf("%s: %s listens on %s, which is no containerPort", name, file, m[1])
					}
				}
				dir := regexp.MustCompile(`store_dir: (\S+)`).FindStringSubmatch(conf)[1]
				if _, claim, _ := mounted(o, c, dir); claim == "" {
					t.Errorf("%s: store_dir %s is not on a volume claim", name, dir)
				}
				for k, v := range env {
					if !strings.HasPrefix(k, "NATS_ROUTE_") && !strings.HasPrefix(k, "EDGELIMIT_HUB_URL") {
						continue
					}
					host, port := hostPort(t, v)
					s, ok := pod(host)
					want := map[bool]string{true: "6222", false: "7422"}[strings.HasPrefix(k, "NATS_ROUTE_")]
					if !ok || port != want || (want == "6222" && s.Metadata.Name != name) ||
						(want == "7422" && !strings.Contains(configMaps["nats-config"]["hub-region.conf"], "listen: 0.0.0.0:7422")) {
						t.Errorf("%s: %s=%s is no server of the right region and port %s", name, k, v, want)
					}
				}
			default:
				t.Errorf("%s: unexpected container %s", name, c.Name)
			}
		}
	}
	if pops != 3 || nats != 3 {
		t.Errorf("%d PoP and %d NATS StatefulSets, want 3 each (one per region)", pops, nats)
	}
}

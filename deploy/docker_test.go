package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, COPY, ...
	args string
}

func parseDockerfile(t *testing.T, text string) []instruction {
	t.Helper()
	var out []instruction
	var cur strings.Builder
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

// execForm reads a JSON-array (exec form) argument list.
func execForm(t *testing.T, what, args string) []string {
	t.Helper()
	var out []string
	if err := json.Unmarshal([]byte(args), &out); err != nil {
		t.Fatalf("%s %s: not in exec form (a JSON array): %v", what, args, err)
	}
	return out
}

// flagsOf returns the --flag names in args (the part before any '=').
func flagsOf(args []string) []string {
	var out []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			out = append(out, strings.SplitN(strings.TrimLeft(a, "-"), "=", 2)[0])
		}
	}
	return out
}

// envFlag returns the pop flag an EDGELIMIT_* variable sets ("" if name is
// not one).
func envFlag(name string) string {
	f, ok := strings.CutPrefix(name, "EDGELIMIT_")
	if !ok {
		return ""
	}
	return strings.ToLower(strings.ReplaceAll(f, "_", "-"))
}

// dockerignored says whether .dockerignore's patterns exclude path (a path
// in the build context).
func dockerignored(patterns []string, p string) bool {
	for _, pat := range patterns {
		pat = strings.TrimPrefix(pat, "/")
		anyDir := strings.HasPrefix(pat, "**/")
		pat = strings.TrimPrefix(pat, "**/")
		parts := strings.Split(p, "/")
		for i := range parts {
			for j := i + 1; j <= len(parts); j++ {
				if i > 0 && !anyDir {
					break
				}
				if ok, _ := path.Match(pat, strings.Join(parts[i:j], "/")); ok {
					return true
				}
			}
		}
	}
	return false
}

// TestDockerfile checks deploy/Dockerfile without a container runtime:
// what it copies from the build context exists and is not excluded by
// .dockerignore; the Go version of its build stage is go.mod's; every flag
// and EDGELIMIT_* variable it passes is one of `edgelimit pop --help`; the
// data volume is the PoP's data directory and owned by the user it runs as;
// the default rule file is in the image. Then it runs the image's CMD and
// HEALTHCHECK with the image's environment, the binary built here and the
// image's paths mapped to the files they are copied from.
func TestDockerfile(t *testing.T) {
	flags := popFlags(t)
	ins := parseDockerfile(t, readRepoFile(t, "deploy/Dockerfile"))
	var ignore []string
	for _, l := range strings.Split(readRepoFile(t, ".dockerignore"), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			ignore = append(ignore, l)
		}
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(readRepoFile(t, "go.mod"))[1]

	copied := map[string]string{} // image path -> repository path
	owned := map[string]string{}  // image path -> --chown owner
	env := map[string]string{}
	var user, volume string
	var entrypoint, cmd, health []string
	for _, in := range ins {
		switch in.cmd {
		case "FROM":
			if img := strings.Fields(in.args)[0]; strings.HasPrefix(img, "golang:") &&
				!strings.HasPrefix(strings.TrimPrefix(img, "golang:"), goVersion+"-") {
				t.Errorf("build stage %s is not go.mod's Go %s", img, goVersion)
			}
		case "COPY":
			f := strings.Fields(in.args)
			var from, chown string
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				if v, ok := strings.CutPrefix(f[0], "--from="); ok {
					from = v
				}
				if v, ok := strings.CutPrefix(f[0], "--chown="); ok {
					chown = v
				}
				f = f[1:]
			}
			dst := f[len(f)-1]
			owned[dst] = chown
			if from != "" {
				copied[dst] = ""
				continue
			}
			for _, src := range f[:len(f)-1] {
				if src == "." {
					continue
				}
				if _, err := os.Stat(filepath.Join("..", src)); err != nil {
					t.Errorf("COPY %s: %v", src, err)
				}
				if dockerignored(ignore, src) {
					t.Errorf("COPY %s: .dockerignore excludes it", src)
				}
				copied[dst] = src
			}
		case "RUN":
			if m := regexp.MustCompile(`go build .* (\./\S+)$`).FindStringSubmatch(in.args); m != nil {
				if _, err := os.Stat(filepath.Join("..", m[1])); err != nil {
					t.Errorf("RUN go build %s: %v", m[1], err)
				}
			}
		case "ENV":
			for _, kv := range strings.Fields(in.args) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
				if f := envFlag(k); f != "" && !slices.Contains(flags, f) {
					t.Errorf("ENV %s sets no flag of edgelimit pop (no --%s)", k, f)
				}
			}
		case "USER":
			user = in.args
		case "VOLUME":
			volume = in.args
		case "ENTRYPOINT":
			entrypoint = execForm(t, "ENTRYPOINT", in.args)
		case "CMD":
			cmd = execForm(t, "CMD", in.args)
		case "HEALTHCHECK":
			_, c, ok := strings.Cut(in.args, "CMD ")
			if !ok {
				t.Fatalf("HEALTHCHECK %s has no CMD", in.args)
			}
			health = execForm(t, "HEALTHCHECK CMD", c)
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if uid == "" || uid == "0" || uid == "root" {
		t.Errorf("the image sets no non-root USER (%q)", user)
	}
	if volume == "" || volume != env["EDGELIMIT_DATA"] {
		t.Errorf("VOLUME %q is not the PoP's data directory EDGELIMIT_DATA=%q", volume, env["EDGELIMIT_DATA"])
	}
	if !strings.HasPrefix(owned[volume], uid+":") && owned[volume] != uid {
		t.Errorf("the data volume %s is not copied in owned by the image's user %s (COPY --chown=%q): the PoP cannot write its state", volume, uid, owned[volume])
	}
	if len(health) == 0 {
		t.Fatal("no HEALTHCHECK")
	}
	bin := edgelimitBin(t)
	if _, ok := copied[entrypoint[0]]; len(entrypoint) != 1 || health[0] != entrypoint[0] || !ok {
		t.Fatalf("ENTRYPOINT %v / HEALTHCHECK %v: not the copied binary", entrypoint, health)
	}
	if len(cmd) == 0 || cmd[0] != "pop" {
		t.Fatalf("CMD %v does not run a PoP", cmd)
	}
	for _, f := range flagsOf(cmd[1:]) {
		if !slices.Contains(flags, f) {
			t.Errorf("CMD passes --%s, which edgelimit pop does not have", f)
		}
	}

	// Run CMD and HEALTHCHECK as the image would, outside a container.
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	runEnv := []string{"EDGELIMIT_LISTEN=" + listen, "EDGELIMIT_DATA=" + t.TempDir()}
	args := slices.Clone(cmd)
	for i, a := range args {
		if src, ok := copied[a]; ok && src != "" {
			args[i] = filepath.Join("..", src)
		} else if strings.HasPrefix(a, "/") {
			t.Errorf("CMD names %s, which the image does not contain", a)
		}
	}
	waitReady(t, start(t, "image-cmd", bin, runEnv, args...), listen)
	probe := exec.Command(bin, health[1:]...)
	probe.Env = append(os.Environ(), runEnv...)
	if out, err := probe.CombinedOutput(); err != nil {
		t.Fatalf("HEALTHCHECK %v with the image's environment: %v\n%s", health, err, out)
	}
}

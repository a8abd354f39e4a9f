package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// LeafEnv returns the environment entry of the hub region's servers that
// lets the leaf links in, as an operator sets it: EDGELIMIT_LEAF_NKEY, the
// public key edgelimit natsconf wrote to keys/leaf.pub. It checks that
// leaf.pub is the public key of keys/leaf.nk. The leaf regions' servers
// take the seed from a file instead (LeafRemote).
func LeafEnv(keys string) (hub string, err error) {
	pub, err := os.ReadFile(filepath.Join(keys, "leaf.pub"))
	if err != nil {
		return "", err
	}
	kp, err := leafKey(keys)
	if err != nil {
		return "", err
	}
	if p, err := kp.PublicKey(); err != nil || p != strings.TrimSpace(string(pub)) {
		return "", fmt.Errorf("%s does not hold leaf.nk's public key (%s, %v)", filepath.Join(keys, "leaf.pub"), p, err)
	}
	return "EDGELIMIT_LEAF_NKEY=" + strings.TrimSpace(string(pub)), nil
}

// LeafRemote puts keys/leaf-remote.conf, which edgelimit natsconf wrote,
// into dir/keys/ with mode 0600, where deploy/nats/leaf-region.conf beside
// it in dir includes it: the leaf links' seed, as an operator gives it to a
// leaf region's server. It checks that the file sets leaf.nk's seed.
func LeafRemote(keys, dir string) error {
	text, err := os.ReadFile(filepath.Join(keys, "leaf-remote.conf"))
	if err != nil {
		return err
	}
	kp, err := leafKey(keys)
	if err != nil {
		return err
	}
	seed, err := kp.Seed()
	if err != nil {
		return err
	}
	if !strings.Contains(string(text), "\nnkey: "+string(seed)+"\n") {
		return fmt.Errorf("%s does not set nkey to leaf.nk's seed", filepath.Join(keys, "leaf-remote.conf"))
	}
	if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "keys", "leaf-remote.conf"), text, 0o600)
}

// leafKey reads the leaf links' nkey, keys/leaf.nk.
func leafKey(keys string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(filepath.Join(keys, "leaf.nk"))
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(keys, "leaf.nk"), err)
	}
	return kp, nil
}

// ConfVars returns the variables ($NAME) a nats-server config uses outside
// comments: the environment must set each (the server refuses to start on
// an unset one).
func ConfVars(text string) []string {
	var out []string
	re := regexp.MustCompile(`\$([A-Za-z_][A-Za-z0-9_]*)`)
	for _, line := range strings.Split(text, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		for _, m := range re.FindAllStringSubmatch(line, -1) {
			if !slices.Contains(out, m[1]) {
				out = append(out, m[1])
			}
		}
	}
	return out
}

// Replace returns text with every old of pairs (old, new, old, new, …)
// replaced by its new, or an error naming file and the first old that does
// not occur: the file changed under its user.
func Replace(file, text string, pairs ...string) (string, error) {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(text, pairs[i]) {
			return "", fmt.Errorf("%s no longer contains %q: update its user along with the file", file, pairs[i])
		}
		text = strings.ReplaceAll(text, pairs[i], pairs[i+1])
	}
	return text, nil
}

// CheckEnv returns an error naming the first variable that conf's text uses
// and env (NAME=value entries) does not set.
func CheckEnv(file, text string, env []string) error {
	for _, v := range ConfVars(text) {
		if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, v+"=") }) {
			return fmt.Errorf("%s uses $%s, which is not set: update its user along with the file", file, v)
		}
	}
	return nil
}

// JetStreamDomain asks, as user with password connected to url, which
// JetStream domain answers: the server's own, or with via set, domain via's
// through it.
func JetStreamDomain(url, user, password, via string) (string, error) {
	nc, err := nats.Connect(url, nats.UserInfo(user, password), nats.Timeout(time.Second))
	if err != nil {
		return "", err
	}
	defer nc.Close()
	var js jetstream.JetStream
	if via == "" {
		js, err = jetstream.New(nc)
	} else {
		js, err = jetstream.NewWithDomain(nc, via)
	}
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := js.AccountInfo(ctx)
	if err != nil {
		return "", err
	}
	return info.Domain, nil
}

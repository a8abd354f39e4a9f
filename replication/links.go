package replication

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrLeafRefused is returned by LinkWatch.Refused, wrapped with the hub's
// answer, while a leaf link of the embedded server is down and the hub
// refused its credential the last time it tried: a misconfiguration that
// does not heal by itself (no --nats-leaf-nkey, or one the hub does not
// list), unlike a cut network.
var ErrLeafRefused = errors.New("replication: the hub refuses this region's leaf link")

// LinkWatch watches the leaf links an embedded NATS server makes to the hub
// region (ServerConfig.Links). The policy it serves: a region whose link
// is refused for its credential is not ready (Refused), since it would stay
// cut off for good while it counted alone; a link that is down for any other
// reason — the network, the hub restarting — leaves the PoP ready (it
// limits on what it knows, and global limits shrink to the partition share)
// and only counts in Down, which an alert watches. Safe for concurrent
// use; the methods of a nil LinkWatch say all is well.
type LinkWatch struct {
	remotes []string
	srv     atomic.Pointer[server.Server]

	mu      sync.Mutex
	refused string // the hub's last refusal, "" once a link is up; requires mu
}

// NewLinkWatch returns a watch of the leaf links to remotes, the hub's leaf
// URLs (one link each).
func NewLinkWatch(remotes []string) *LinkWatch {
	return &LinkWatch{remotes: remotes}
}

// attach binds the watch to the server StartServer started.
func (w *LinkWatch) attach(s *server.Server) { w.srv.Store(s) }

// serverLine is called with every warning and error line of the server; it
// notes a refusal of a leaf link's credential.
func (w *LinkWatch) serverLine(msg string) {
	l := strings.ToLower(msg)
	if !strings.Contains(l, "leaf") || !(strings.Contains(l, "authorization violation") || strings.Contains(l, "authentication")) {
		return
	}
	w.mu.Lock()
	w.refused = msg
	w.mu.Unlock()
}

// Down returns how many leaf links to the hub are not up.
func (w *LinkWatch) Down() int {
	if w == nil {
		return 0
	}
	s := w.srv.Load()
	if s == nil {
		return len(w.remotes)
	}
	up := 0
	if lz, err := s.Leafz(nil); err == nil {
		for _, l := range lz.Leafs {
			if l.IsSpoke {
				up++
			}
		}
	}
	return max(len(w.remotes)-up, 0)
}

// Refused returns ErrLeafRefused, wrapped with the hub's answer, while a
// leaf link is down and the hub refused its credential when it last tried;
// nil otherwise.
func (w *LinkWatch) Refused() error {
	if w == nil {
		return nil
	}
	down := w.Down()
	w.mu.Lock()
	defer w.mu.Unlock()
	if down == 0 {
		w.refused = ""
		return nil
	}
	if w.refused == "" {
		return nil
	}
	return fmt.Errorf("%w (%d of %d links to %s down): %s; give the leaf links a credential the hub lists (--nats-leaf-nkey, see docs/replication-security.md)",
		ErrLeafRefused, down, len(w.remotes), strings.Join(w.remotes, ", "), w.refused)
}

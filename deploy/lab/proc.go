package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Proc is a process the lab (or a test of deploy/) started, inside a
// namespace or not. `ip netns exec` execs the program itself, so the pid
// is the program's. Its methods are safe for concurrent use.
type Proc struct {
	Name string
	Log  string // the file holding its output
	cmd  *exec.Cmd
	done chan struct{}
}

// StartProc runs bin with args in namespace ns (the caller's own for ""),
// its environment the caller's plus env, its output in dir/name.log. A
// process whose starter dies is killed with it (Pdeathsig); Teardown kills
// any left in the lab's namespaces.
func StartProc(dir, ns, name string, env []string, bin string, args ...string) (*Proc, error) {
	log := filepath.Join(dir, name+".log")
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	if ns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", ns, bin}, args...)...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: log, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// Kill sends SIGKILL (kill -9) and waits for the process to end.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Terminate sends SIGTERM, as a service manager stops a service, and kills
// the process when it has not ended after 10 s.
func (p *Proc) Terminate() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}

// Exited says whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Tail returns the last n bytes of the process's log.
func (p *Proc) Tail(n int) string {
	b, _ := os.ReadFile(p.Log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

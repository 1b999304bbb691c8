package store

import (
	"os/exec"
	"syscall"
)

// dieWithTest makes the kernel kill cmd when the test process dies (a
// timeout, a crash), so no server outlives a failed run and holds its port.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

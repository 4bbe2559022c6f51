// Command pause is the process of a pod's sandbox container: it holds the pod's namespaces
// open and does nothing else, as the pause of kubernetes/build/pause does (that one is C;
// this one builds with `go build` and no registry, for hack/setup-node's local image). It
// exits on SIGINT or SIGTERM and reaps children it inherits as PID 1.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

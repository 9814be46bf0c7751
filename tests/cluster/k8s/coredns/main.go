// Cluster DNS for the real-node tests: CoreDNS with only the plugins a test cluster needs
// (the kubernetes plugin answers NAME.NAMESPACE.svc.cluster.local from Services and
// EndpointSlices). Built by tests/cluster/install.sh; a slim build compiles in a fraction of
// the time of CoreDNS's own main, which links every plugin and cloud SDK.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order in which the plugins see a query (CoreDNS's plugin.cfg order for these).
func init() {
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes"}
}

func main() { coremain.Run() }

package testutil

import (
	"fmt"
	"net/netip"
)

// ClusterIP is the clusterIP address that the IP tests give a Service on
// port: a loopback address apart from 127.0.0.1, so that nothing listens
// on it unless a test binds it.
func ClusterIP(port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.77"), port)
}

// ClusterIPService is the manifest of the Service ns/name with the
// clusterIP and the one port of vip.
func ClusterIPService(ns, name string, vip netip.AddrPort) string {
	return fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata: {name: %s, namespace: %s}
spec:
  clusterIP: %s
  ports: [{port: %d}]
`, name, ns, vip.Addr(), vip.Port())
}

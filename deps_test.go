package inmesh

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The library's module carries only what its packages need: the
// Prometheus exporter and client, otelhttp and the examples' other
// dependencies stay in the examples module (their tests scrape through the
// real exporter), so that importing one inmesh package brings none of them.
func TestLibraryModuleDependencies(t *testing.T) {
	data, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, forbidden := range []string{
		"github.com/prometheus/",
		"go.opentelemetry.io/otel/exporters/prometheus",
		"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp",
		"google.golang.org/grpc/interop",
		"golang.org/x/oauth2",
		"go.etcd.io/etcd/server", // tests start etcd from the examples module
	} {
		if strings.Contains(string(data), forbidden) {
			t.Errorf("go.mod requires %s, which only the examples module may", forbidden)
		}
	}
}

// deps lists the packages pkg imports, directly or not (go list -deps).
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the imports with")
	}
	out, err := exec.Command(goTool, "list", "-deps", pkg).Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

// The models are plain data and the balancer knows no routing model: the
// arrows between packages point one way, as the package documentation
// says.
func TestPackageBoundaries(t *testing.T) {
	const mod = "github.com/inmesh/inmesh/"
	for _, tc := range []struct {
		pkg       string
		forbidden func(dep string) bool
	}{
		{"balancer/endpoint", func(dep string) bool {
			first, _, _ := strings.Cut(dep, "/")
			return strings.Contains(first, ".") // the standard library only
		}},
		{"profiles", func(dep string) bool {
			return strings.HasPrefix(dep, "google.golang.org/protobuf/") || dep == "google.golang.org/grpc" ||
				strings.HasPrefix(dep, mod+"destination") || dep == mod+"balancer" || dep == mod+"policy"
		}},
		{"policy", func(dep string) bool {
			return strings.HasPrefix(dep, "google.golang.org/protobuf/") || dep == "google.golang.org/grpc" ||
				strings.HasPrefix(dep, mod+"destination") || dep == mod+"balancer" || dep == mod+"profiles"
		}},
		{"balancer", func(dep string) bool {
			return dep == mod+"profiles" || dep == mod+"policy" || strings.HasPrefix(dep, mod+"destination") || dep == mod+"router"
		}},
		// A control plane over files links no etcd client: only package
		// controlplane/etcdstore does.
		{"controlplane", func(dep string) bool { return strings.HasPrefix(dep, "go.etcd.io/") }},
		{"mesh", func(dep string) bool { return strings.HasPrefix(dep, "go.etcd.io/") }},
	} {
		for _, dep := range deps(t, mod+tc.pkg) {
			if dep != mod+tc.pkg {
				assert.False(t, tc.forbidden(dep), "%s imports %s", tc.pkg, dep)
			}
		}
	}
}

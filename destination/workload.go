package destination

import (
	"encoding/json"
	"fmt"
	"strings"
)

// ParseWorkload reads a workload string as Linkerd's policy controller
// does (policy-controller/grpc/src/workload.rs): "NS:POD", or JSON naming
// "ns" and exactly one of "pod" and "external_workload", as
// [PolicyWorkload] writes it. It returns the namespace and the pod (or
// external workload) name, or an error that shows the expected forms.
func ParseWorkload(s string) (namespace, name string, err error) {
	if strings.HasPrefix(s, "{") {
		var w struct {
			NS       *string `json:"ns"`
			Pod      *string `json:"pod"`
			External *string `json:"external_workload"`
		}
		if err := json.Unmarshal([]byte(s), &w); err != nil {
			return "", "", fmt.Errorf("workload %q: %v (want NS:POD, or JSON such as %s)", s, err, PolicyWorkload("default", "web-0"))
		}
		switch {
		case w.NS == nil || *w.NS == "":
			return "", "", fmt.Errorf("workload %q: no \"ns\" (want NS:POD, or JSON such as %s)", s, PolicyWorkload("default", "web-0"))
		case (w.Pod != nil) == (w.External != nil):
			return "", "", fmt.Errorf("workload %q: name one of \"pod\" and \"external_workload\" (want NS:POD, or JSON such as %s)", s, PolicyWorkload("default", "web-0"))
		case w.Pod != nil && *w.Pod != "":
			return *w.NS, *w.Pod, nil
		case w.External != nil && *w.External != "":
			return *w.NS, *w.External, nil
		}
		return "", "", fmt.Errorf("workload %q: empty name (want NS:POD, or JSON such as %s)", s, PolicyWorkload("default", "web-0"))
	}
	ns, pod, ok := strings.Cut(s, ":")
	if !ok || ns == "" || pod == "" || strings.Contains(pod, ":") {
		return "", "", fmt.Errorf("workload %q is not of the form NS:POD (such as default:web-0), nor Linkerd's JSON (such as %s)", s, PolicyWorkload("default", "web-0"))
	}
	return ns, pod, nil
}

package testutil

// FullProfile is a ServiceProfile that uses every field of the format:
// routes with nested response-class conditions, a retry budget, dst
// overrides with milli-weights and opaque ports.
const FullProfile = `
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata:
  name: books.default.svc.cluster.local
  namespace: default
spec:
  routes:
  - name: GET /books/{id}
    condition:
      method: GET
      pathRegex: /books/\d+
    responseClasses:
    - condition:
        status: {min: 533, max: 533}
      isFailure: false
    - condition:
        all:
        - status: {min: 500, max: 599}
        - not:
            status: {min: 503}
      isFailure: true
    - condition:
        any:
        - status: {max: 429}
      isFailure: true
    isRetryable: true
    timeout: 300ms
  - name: everything else
    condition:
      all: []
  - name: POST or PUT
    condition:
      any:
      - method: POST
      - method: PURGE
      not:
        pathRegex: /admin/.*
  retryBudget:
    retryRatio: 0.25
    minRetriesPerSecond: 7
    ttl: 15s
  dstOverrides:
  - authority: books-v1.default.svc.cluster.local:7000
    weight: 1
  - authority: books-v2.default.svc.cluster.local
    weight: 500m
  opaquePorts: [3306, "5432"]
`

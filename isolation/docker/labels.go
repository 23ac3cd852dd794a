package docker

import (
	"encoding/json"
	"strconv"

	"github.com/stormdock/stormdock/isolation"
)

// Labels on every worker container. LabelManaged marks the container as stormdock's; the
// others let operators filter (docker ps --filter label=io.stormdock.job=wordcount) and let a
// restarted agent adopt its node's workers with the spec they were started from.
const (
	LabelManaged = "io.stormdock.managed"
	LabelID      = "io.stormdock.id"
	LabelJob     = "io.stormdock.job"
	LabelWorker  = "io.stormdock.worker"
	LabelNode    = "io.stormdock.node"
	LabelTenant  = "io.stormdock.tenant"
	LabelSpec    = "io.stormdock.spec"
)

func labels(spec isolation.Spec) (map[string]string, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	return map[string]string{
		LabelManaged: "true",
		LabelID:      spec.ID,
		LabelJob:     spec.Job,
		LabelWorker:  strconv.Itoa(spec.Worker),
		LabelNode:    spec.Node,
		LabelTenant:  spec.Tenant,
		LabelSpec:    string(b),
	}, nil
}

// specOf recovers the spec a container was started from.
func specOf(l map[string]string) (isolation.Spec, error) {
	var s isolation.Spec
	err := json.Unmarshal([]byte(l[LabelSpec]), &s)
	return s, err
}

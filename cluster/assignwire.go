package cluster

import (
	"encoding/json"
	"fmt"
	"reflect"
)

// A node's assignment goes to the store in a compact form: the workers of one job differ
// only in their key, so each distinct worker with its key cleared is written once, as a
// template, and each worker as its key and the index of its template. A node running 500
// workers of a job with a 10 KiB environment then writes 10 KiB and 500 keys, not 5 MiB:
// assignments stay far below ZooKeeper's 1 MiB limit on a value however many workers a node
// takes. The form is private to the encoding: NodeAssignment values are always expanded.
// Older readers' form, every worker written whole, is still read.

// assignmentFields is NodeAssignment without its methods, so that the wire types below can
// embed it and inherit every field, present and future; their own Workers shadows it.
type assignmentFields NodeAssignment

// workerFields is WorkerAssignment without methods, embedded in the same way.
type workerFields WorkerAssignment

// template is a worker without its key.
type template struct {
	workerFields
	Key *WorkerKey `json:"key,omitempty"` // always nil: shadows workerFields.Key
}

// workerRef is a worker as written: its key and its template.
type workerRef struct {
	Key WorkerKey `json:"key"`
	T   int       `json:"t"`
}

type wireAssignmentOut struct {
	assignmentFields
	Templates []template  `json:"templates,omitempty"`
	Workers   []workerRef `json:"workers"`
}

// wireWorkerIn reads both forms of a worker: whole (T nil) or a reference to a template.
type wireWorkerIn struct {
	workerFields
	T *int `json:"t,omitempty"`
}

type wireAssignmentIn struct {
	assignmentFields
	Templates []workerFields `json:"templates,omitempty"`
	Workers   []wireWorkerIn `json:"workers"`
}

// MarshalJSON writes the compact form. Templates are numbered in the order of their first
// worker, so equal assignments encode to equal bytes.
func (a NodeAssignment) MarshalJSON() ([]byte, error) {
	out := wireAssignmentOut{assignmentFields: assignmentFields(a)}
	out.assignmentFields.Workers = nil
	if a.Workers != nil {
		out.Workers = make([]workerRef, 0, len(a.Workers))
	}
	index := map[string]int{}
	lastIdx := -1 // the previous worker's template: workers of one job are usually adjacent
	for _, w := range a.Workers {
		t := template{workerFields: workerFields(w)}
		t.workerFields.Key = WorkerKey{}
		// Workers of one job share their maps and slices: comparing them costs little,
		// and spares encoding each worker's template.
		if lastIdx >= 0 && reflect.DeepEqual(out.Templates[lastIdx].workerFields, t.workerFields) {
			out.Workers = append(out.Workers, workerRef{Key: w.Key, T: lastIdx})
			continue
		}
		b, err := json.Marshal(t)
		if err != nil {
			return nil, fmt.Errorf("encode worker %s: %w", w.Key, err)
		}
		i, ok := index[string(b)]
		if !ok {
			i = len(out.Templates)
			index[string(b)] = i
			out.Templates = append(out.Templates, t)
		}
		lastIdx = i
		out.Workers = append(out.Workers, workerRef{Key: w.Key, T: i})
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads either form.
func (a *NodeAssignment) UnmarshalJSON(data []byte) error {
	var in wireAssignmentIn
	if err := json.Unmarshal(data, &in); err != nil {
		return err
	}
	*a = NodeAssignment(in.assignmentFields)
	a.Workers = nil
	if in.Workers != nil {
		a.Workers = make([]WorkerAssignment, 0, len(in.Workers))
	}
	for i, w := range in.Workers {
		if w.T == nil {
			a.Workers = append(a.Workers, WorkerAssignment(w.workerFields))
			continue
		}
		if *w.T < 0 || *w.T >= len(in.Templates) {
			return fmt.Errorf("assignment of node %q: worker %d names template %d of %d", a.Node, i, *w.T, len(in.Templates))
		}
		// Workers of one template share its slices and maps: assignments are read, never
		// changed in place.
		full := WorkerAssignment(in.Templates[*w.T])
		full.Key = w.Key
		a.Workers = append(a.Workers, full)
	}
	return nil
}

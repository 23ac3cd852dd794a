package cluster

import "time"

// ImagePin is a job's image tag resolved to the digest its registry served, for one
// generation of the job: every worker of that generation runs exactly those bytes, whatever
// the tag points at later.
type ImagePin struct {
	Generation int64  `json:"generation"`
	Image      string `json:"image"` // as the spec names it
	// Ref is the image by digest (NAME@sha256:...); empty while it is not pinned.
	Ref      string    `json:"ref,omitempty"`
	Digest   string    `json:"digest,omitempty"`
	Resolved time.Time `json:"resolved,omitzero"`
	// Error says why it is not pinned (yet): the registry's answer. The master tries again.
	Error string `json:"error,omitempty"`
	// NoAccess: the tenant may not read the image (neither its own registry credentials
	// nor a shared prefix reach it), so no worker will run it either until that changes.
	NoAccess bool `json:"noAccess,omitempty"`
}

// PinnedFor returns the pinned reference for generation gen, or "".
func (p *ImagePin) PinnedFor(gen int64) string {
	if p == nil || p.Generation != gen {
		return ""
	}
	return p.Ref
}

// Pre-pull states an agent reports for the images of NodeAssignment.Prepull.
const (
	ImagePulling = "pulling"
	ImageReady   = "ready"
	ImageFailed  = "failed"
)

// ImageStatus is one pre-pulled image as the node's agent reports it.
type ImageStatus struct {
	Ref   string    `json:"ref"`
	State string    `json:"state"`
	Error string    `json:"error,omitempty"`
	Since time.Time `json:"since"`
}

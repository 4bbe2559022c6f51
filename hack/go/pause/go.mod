// The pause program of hack/setup-node's sandbox image: no dependencies.
module kubeloop.local/hack/pause

go 1.26

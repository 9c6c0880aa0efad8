"""Files nvtrain ships for users to start from: starter scripts, policies and Kubernetes manifests."""

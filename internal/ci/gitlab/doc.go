// Package gitlab is the GitLab Runner custom executor (docs/ci.md):
// GitLab Runner calls `microvm ci gitlab config`, then `prepare` once per
// job, `run SCRIPT STAGE` once per sub-stage (prepare_script,
// get_sources, restore_cache, step_script, after_script, archive_cache,
// upload_artifacts_on_*, ...), and `cleanup` at the end, whatever
// happened. The job's variables come as CUSTOM_ENV_*; a failure of the
// job's own script exits $BUILD_FAILURE_EXIT_CODE, a failure of microvm
// or the VM $SYSTEM_FAILURE_EXIT_CODE, so GitLab tells a failed job from
// a broken runner (ExitStatus maps an error to its status, which the CLI
// exits with).
//
// One named VM per job (gitlab-JOB-HASH, HASH from the job's token: see
// cijob.go for what keys isolation) from the job's image (or
// --default-image) with --net user, and a cache per project and
// concurrency slot (cicache.go): a private clone of the slot's newest
// committed version (internal/cachedisk, under --cache-dir) mounted at
// /cache, committed by cleanup as the next version when the job passed
// and discarded when it did not, so that caches survive from one passing
// job to the next; with --cache-limit (noted in the job's record by
// prepare) that commit also evicts the store's oldest versions, never a
// cache's newest, until the store fits. With
// --warm-pool, the slot's next VM is booted by cleanup and taken by the
// next prepare (cipool.go). With --docker, prepare gives the VM a data disk
// of the job's own and starts Docker in it (internal/dockervm) before the
// job's stages; cleanup removes the disk (cidocker.go). With
// --docker-cache the data disk is a clone of the slot's Docker cache
// instead, which cleanup commits as the slot's cache is, once dockerd is
// stopped and its data root unmounted.
//
// The executor drives microvm's own CLI for the job's VM (run --name
// --detach, started through Runtime.Executable) and reaches the VM by its
// name (internal/namedvm) and its agent (internal/agentvm).
package gitlab

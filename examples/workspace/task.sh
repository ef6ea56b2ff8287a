# A small agent task for the docker-compose stack (and tests/e2e/test_run_compose.py).
# Every exec below is decided by the policy service.
set -u
echo "building in $(pwd)"
printf 'hello from the agent\n' > out.txt
wc -l < out.txt
# su, not sudo: su is on every Debian system (the image and CI), and a program that does not exist
# is refused with "command not found" before anyone is asked.
su -c true || echo "su was refused (status $?)"
echo "done"

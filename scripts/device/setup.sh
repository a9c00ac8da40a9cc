# Sourced on the device: Vulkan loader, NVIDIA ICD, models where the tests look. (Calls run in a
# copy of the checkout at this machine's path, so the golden files are where the test binaries
# were compiled to look.)
for f in ./.gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export OCTOFLOW_HOME=$HOME/octo
mkdir -p "$OCTOFLOW_HOME/models"
for m in "$HOME"/models/*.gguf; do ln -sf "$m" "$OCTOFLOW_HOME/models/"; done

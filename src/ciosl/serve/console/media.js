// The camera (getUserMedia) and files: frames and images become base64 for the API's
// "images", .npy feature files become rows of "x"; each item keeps a thumbnail to show.

import { parseNpy } from "./api.js";

let stream = null;

// Start the camera into a <video>; throws one line when the browser refuses or has none.
export async function startCamera(video) {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new Error("this browser offers no camera here (a camera needs https or localhost)");
  }
  if (!stream) {
    try {
      stream = await navigator.mediaDevices.getUserMedia({ video: true, audio: false });
    } catch (e) {
      throw new Error(`the camera: ${e.name}: ${e.message}`.split("\n")[0]);
    }
  }
  video.srcObject = stream;
  await video.play().catch(() => {});
  await new Promise((resolve) => {
    if (video.videoWidth > 0) resolve();
    else video.addEventListener("loadeddata", resolve, { once: true });
  });
}

export function cameraOn() { return stream !== null; }

// One frame of a playing <video>: {image: base64 JPEG, thumb: data URL}
export function grab(video) {
  const canvas = document.createElement("canvas");
  const scale = Math.min(1, 320 / Math.max(video.videoWidth, video.videoHeight, 1));
  canvas.width = Math.max(1, Math.round(video.videoWidth * scale));
  canvas.height = Math.max(1, Math.round(video.videoHeight * scale));
  canvas.getContext("2d").drawImage(video, 0, 0, canvas.width, canvas.height);
  const url = canvas.toDataURL("image/jpeg", 0.9);
  return { image: url.slice(url.indexOf(",") + 1), thumb: url, name: "camera frame" };
}

// n frames spread over `seconds` (the object turned meanwhile); onFrame(k) after each
export async function burst(video, n, seconds, onFrame) {
  const frames = [];
  const gap = (seconds * 1000) / Math.max(n - 1, 1);
  for (let k = 0; k < n; k++) {
    if (k) await new Promise((r) => setTimeout(r, gap));
    frames.push(grab(video));
    if (onFrame) onFrame(k + 1);
  }
  return frames;
}

function base64(buffer) {
  const bytes = new Uint8Array(buffer);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}

// An image file as sent: as it is when its longer side is at most MAX_SIDE pixels, else
// scaled down to that and sent as JPEG (a phone's 12-megapixel photo is 5 MB; the extractor
// sees a few hundred pixels a side, and the server bounds the pixels of a request).
const MAX_SIDE = 640;

async function shrink(file, buffer) {
  let bitmap;
  try {
    bitmap = await createImageBitmap(file);
  } catch (e) {
    throw new Error(`${file.name}: not an image this browser can read`);
  }
  const side = Math.max(bitmap.width, bitmap.height);
  if (side <= MAX_SIDE) {
    bitmap.close();
    return { image: base64(buffer), thumb: URL.createObjectURL(file), name: file.name };
  }
  const canvas = document.createElement("canvas");
  canvas.width = Math.max(1, Math.round((bitmap.width * MAX_SIDE) / side));
  canvas.height = Math.max(1, Math.round((bitmap.height * MAX_SIDE) / side));
  canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  bitmap.close();
  const url = canvas.toDataURL("image/jpeg", 0.9);
  return { image: url.slice(url.indexOf(",") + 1), thumb: url,
           name: `${file.name} (${canvas.width} x ${canvas.height})` };
}

export function isNpy(file) { return /\.npy$/i.test(file.name); }

// Files to send: {images: [{image, thumb, name}], rows: [{x, name}]}; throws one line naming
// the file that cannot be read. Images are refused here when the server has no extractor.
export async function readFiles(fileList, hasExtractor) {
  const images = [], rows = [];
  for (const file of Array.from(fileList)) {
    const buffer = await file.arrayBuffer();
    if (isNpy(file)) {
      parseNpy(buffer, file.name).forEach((x, i) => rows.push({ x, name: `${file.name}[${i}]` }));
    } else if (!hasExtractor) {
      throw new Error(`${file.name}: this server takes images only with --extractor; ` +
                      "send .npy feature files");
    } else {
      images.push(await shrink(file, buffer));
    }
  }
  if (images.length && rows.length) {
    throw new Error("send images and .npy files apart (one request is images or features)");
  }
  return { images, rows };
}
